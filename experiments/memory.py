"""Resident memory over long runs: is there a leak that would end a 45-run sweep?

    python -m jagg_lab.train trainer.max_steps=300 log_memory=true hydra.run.dir=outputs/memory/default
    python -m jagg_lab.train +experiment=awm trainer.max_steps=300 log_memory=true hydra.run.dir=outputs/memory/awm
    python experiments/memory.py "runs=[outputs/memory/default,outputs/memory/awm]" out=experiments/results/memory/NEW

Reads `memory_rss_mib` (the process's resident memory after each optimizer step, logged by
`log_memory=true`) from each run's metrics.csv and reports, per run: the memory after the first
step, its peak, and its growth over the last `tail` steps. Resident memory swings by 100-150 MiB
from one step to the next (the allocator keeps or returns freed blocks), so the growth is the
median of the last `ends` steps minus the median of the `ends` steps that open the tail, beside
the least-squares slope over the tail (MiB per 100 steps). A run grows by less than `bound_mib`
over the tail or it FAILS in the table (exit status 1). Writes
`OUT/memory.md`, `OUT/memory.json` (paths relative to the working directory) and
`OUT/memory.png`; `out` must not exist.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from jagg_lab import cli  # noqa: E402
from jagg_lab.bench.report import markdown_table  # noqa: E402

PROG = "python experiments/memory.py"


@dataclass
class Args:
    """Resident memory growth over the last steps of runs trained with log_memory=true."""

    runs: list[str] = field(default_factory=list)  # run directories (each with a metrics.csv holding memory_rss_mib)
    out: str = "???"  # a new directory for memory.md, memory.json and memory.png
    tail: int = 200  # the growth is measured over this many last steps
    ends: int = 20  # steps at each end of the tail whose median memory is compared
    bound_mib: float = 50.0  # a run whose memory grows by more than this over the tail fails

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("runs: name at least one run directory")
        for run in self.runs:
            metrics = Path(run) / "metrics.csv"
            if not metrics.is_file():
                raise ValueError(f"runs: {metrics} does not exist")
            if "memory_rss_mib" not in pd.read_csv(metrics, nrows=1).columns:
                raise ValueError(f"runs: {metrics} has no memory_rss_mib column (train with log_memory=true)")
        if self.tail < 2:
            raise ValueError(f"tail must be >= 2, got {self.tail}")
        if not 1 <= self.ends <= self.tail // 2:
            raise ValueError(f"ends must be in [1, tail / 2], got {self.ends}")
        if Path(self.out).exists():
            raise ValueError(f"out: {self.out} already exists; choose a new directory")


def growth(steps: np.ndarray, rss: np.ndarray, tail: int, ends: int) -> dict:
    """Memory after the first step, its peak, and its growth over the last `tail` steps: the
    median of the last `ends` steps minus that of the first `ends` of the tail, and the
    least-squares slope over the tail (MiB per 100 steps)."""
    window = rss[steps > steps.max() - tail]
    slope = np.polyfit(steps[steps > steps.max() - tail], window, 1)[0] if len(window) >= 2 else float("nan")
    return {"steps": int(steps.max()), "first_mib": float(rss[0]), "peak_mib": float(rss.max()),
            "tail_steps": int(len(window)), "tail_start_median_mib": float(np.median(window[:ends])),
            "tail_end_median_mib": float(np.median(window[-ends:])),
            "tail_growth_mib": float(np.median(window[-ends:]) - np.median(window[:ends])),
            "slope_mib_per_100_steps": float(100 * slope)}


def _main(args: Args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True)
    rows, fig = [], plt.figure(figsize=(7, 4))
    for run in args.runs:
        metrics = pd.read_csv(Path(run) / "metrics.csv").dropna(subset=["memory_rss_mib"])
        steps, rss = metrics["step"].to_numpy(), metrics["memory_rss_mib"].to_numpy()
        report = growth(steps, rss, args.tail, args.ends)
        report["within_bound"] = bool(report["tail_growth_mib"] <= args.bound_mib)
        rows.append({"run": os.path.relpath(run), **report})
        plt.plot(steps, rss, label=os.path.relpath(run))
    plt.xlabel("optimizer step")
    plt.ylabel("resident memory (MiB)")
    plt.legend()
    plt.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    (out / "memory.json").write_text(json.dumps({"tail": args.tail, "ends": args.ends, "bound_mib": args.bound_mib, "runs": rows},
                                                indent=1) + "\n")
    columns = [("run", "run", "{}"), ("steps", "steps", "{}"), ("first_mib", "after step 1 (MiB)", "{:.0f}"),
               ("peak_mib", "peak (MiB)", "{:.0f}"), ("tail_start_median_mib", f"median, first {args.ends} of the last {args.tail} steps (MiB)", "{:.0f}"),
               ("tail_end_median_mib", f"median, last {args.ends} steps (MiB)", "{:.0f}"),
               ("tail_growth_mib", f"growth over the last {args.tail} steps (MiB)", "{:+.1f}"),
               ("slope_mib_per_100_steps", "slope (MiB / 100 steps)", "{:+.2f}"),
               ("verdict", f"within {args.bound_mib:g} MiB", "{}")]
    text = markdown_table([{**r, "verdict": "yes" if r["within_bound"] else "FAIL"} for r in rows], columns)
    (out / "memory.md").write_text(text + "\n")
    print(text)
    return 0 if all(r["within_bound"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    return cli.run(_main, Args, PROG, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
