"""The bias map's table and figure, from the `bench bias` reports `experiments/bias_map.sh` wrote.

    python experiments/bias_map.py results=DIR out=OUT_DIR

For every report in `results` (one per column: steps per trajectory x which steps are trained) and
every window W in it, plain JAGG beside `subsample` at equal backward items (2 per window): the
mean noise span of a window (s_a - s_b of each window of the trained steps, weighted by its steps,
so leftover windows of 1 or 2 steps, which are exact, pull it down), JAGG's z (about 1 without
bias), the odd/even cosine of its mean errors, |mean d| / |mean f|, cos(mean g, mean f), and both
estimators' per-rollout error against the noise `full` carries anyway, and JAGG's bias in the same
unit, sqrt(max(z - 1, 0) / (N + z - 1)) x that error (E z = 1 + N |E d|^2 / tr Cov d and the error
is rms |d| with |d|^2 = |E d|^2 + tr Cov d on average, so this estimates |E d| over the rms noise of
f whatever the number of rollouts N; 0 where z <= 1). Writes `OUT/map.md`,
`OUT/map.json` and `OUT/map.png` (bias and error against window noise span, JAGG against
subsample); `out` must not exist. A report still being written (fewer rollouts than asked) is
used as it stands, its rollouts counted in the table.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jagg_lab import cli  # noqa: E402
from jagg_lab.bench.report import markdown_table  # noqa: E402
from jagg_lab.sampling.schedule import noise_schedule  # noqa: E402
from jagg_lab.strategies import partition_windows  # noqa: E402

PROG = "python experiments/bias_map.py"


@dataclass
class Args:
    """The bias map's table and figure from a directory of `bench bias` reports."""

    results: str = "???"  # the directory experiments/bias_map.sh wrote (its *.json reports)
    out: str = "???"  # a new directory for map.md, map.json and map.png
    extra: list[str] = field(default_factory=list)  # more bench bias reports as COLUMN=FILE, e.g. an earlier run of one setting

    def __post_init__(self) -> None:
        if not Path(self.results).is_dir():
            raise ValueError(f"results: {self.results} is not a directory")
        if Path(self.out).exists():
            raise ValueError(f"out: {self.out} already exists; choose a new directory")
        for entry in self.extra:
            name, _, path = entry.partition("=")
            if not name or not Path(path).is_file():
                raise ValueError(f"extra: {entry!r} is not COLUMN=FILE of an existing report")


def window_span(num_steps: int, shift: float, trained: list[int], window: int) -> float:
    """The noise span s_a - s_b of the windows of `window` trained steps, averaged over the
    trained steps (each window weighted by its number of steps)."""
    levels = noise_schedule(num_steps, shift).tolist()
    windows = [[trained[i] for i in w] for w in partition_windows(len(trained), window)]
    return sum(len(w) * (levels[w[0]] - levels[w[-1]]) for w in windows) / len(trained)


def bias_over_noise(z: float, n: int, rel_error: float) -> float:
    """|E d| over the rms per-rollout noise of f, from z over n rollouts and the per-rollout error
    (rms |d| over that noise): with T = tr Cov d, z - 1 ~ n |E d|^2 / T and E |d|^2 = |E d|^2 + T,
    so |E d|^2 = (z - 1) / (n + z - 1) E |d|^2."""
    return math.sqrt(max(z - 1.0, 0.0) / (n + z - 1.0)) * rel_error


def map_rows(report: dict, column: str) -> list[dict]:
    """One row per window W of a report: JAGG and subsample side by side."""
    setting = report["setting"]
    num_steps, shift = setting["sampler"]["num_steps"], setting["sampler"].get("shift", 1.0)
    trained = setting["trained_steps"]
    by_key = {(r["strategy"], r["window"]): r for r in report["rows"]}
    rows = []
    for (name, window), jagg in sorted(by_key.items(), key=lambda kv: kv[0][1]):
        if name != "jagg" or ("subsample", window) not in by_key:
            continue
        sub = by_key[("subsample", window)]
        rows.append({
            "column": column, "steps": num_steps, "trained_steps": len(trained), "window": window,
            "span": window_span(num_steps, shift, trained, window), "rollouts": report["rollouts_done"],
            "backward_items": jagg["backward_items_per_rollout"], "full_items": by_key[("full", 1)]["backward_items_per_rollout"],
            "jagg_z": jagg["z"], "jagg_halves_cosine": jagg["halves_cosine"],
            "jagg_bias_over_mean_full": jagg["bias_over_mean_full"], "jagg_mean_cosine": jagg["mean_cosine"],
            "jagg_per_rollout_cosine": jagg["per_rollout_cosine"], "jagg_rel_error": jagg["rel_error"],
            "subsample_z": sub["z"], "subsample_rel_error": sub["rel_error"],
            "subsample_per_rollout_cosine": sub["per_rollout_cosine"], "z_full": jagg["z_full"],
            "jagg_bias_over_noise": bias_over_noise(jagg["z"], report["rollouts_done"], jagg["rel_error"]),
        })
    return rows


COLUMNS = [("column", "column", "{}"), ("steps", "steps", "{}"), ("trained_steps", "trained", "{}"),
           ("window", "W", "{}"), ("span", "window noise span", "{:.3f}"), ("rollouts", "rollouts", "{}"),
           ("items", "items (full)", "{}"), ("jagg_z", "JAGG z (no bias ~1)", "{:.2f}"),
           ("jagg_bias_over_noise", "JAGG bias / noise of f", "{:.3f}"),
           ("jagg_halves_cosine", "cos(odd, even mean d)", "{:.2f}"),
           ("jagg_bias_over_mean_full", "\\|mean d\\| / \\|mean f\\|", "{:.2f}"),
           ("jagg_mean_cosine", "cos(mean g, mean f)", "{:.2f}"),
           ("jagg_per_rollout_cosine", "per-rollout cos, JAGG", "{:.3f}"),
           ("jagg_rel_error", "error / noise of f, JAGG", "{:.2f}"),
           ("subsample_rel_error", "error / noise of f, subsample", "{:.2f}"), ("subsample_z", "subsample z", "{:.2f}")]


def table(rows: list[dict]) -> str:
    return markdown_table([{**row, "items": f"{row['backward_items']:.0f} ({row['full_items']:.0f})"} for row in rows], COLUMNS)


def figure(rows: list[dict], path: Path) -> None:
    """Left: JAGG's bias against the window noise span, in units of f's per-rollout noise
    (subsample is unbiased by construction: its z is in the table); right: the per-rollout
    error of both against the same span."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    columns = list(dict.fromkeys(r["column"] for r in rows))
    markers = dict(zip(columns, "osD^v<>p"))
    for column in columns:
        part = sorted((r for r in rows if r["column"] == column), key=lambda r: r["span"])
        span = [r["span"] for r in part]
        label = f"{column} ({part[0]['steps']} steps, {part[0]['trained_steps']} trained)"
        left.plot(span, [r["jagg_bias_over_noise"] for r in part], marker=markers[column], color="C3", label=f"JAGG, {label}")
        right.plot(span, [r["jagg_rel_error"] for r in part], marker=markers[column], color="C3", label=f"JAGG, {column}")
        right.plot(span, [r["subsample_rel_error"] for r in part], marker=markers[column], color="C0", ls=":",
                   label=f"subsample, {column}")
        for r in part:
            left.annotate(f"W={r['window']}, z={r['jagg_z']:.1f}", (r["span"], r["jagg_bias_over_noise"]), fontsize=7,
                          xytext=(3, 3), textcoords="offset points")
    left.axhline(0.0, color="grey", lw=0.8)
    left.set(xlabel="window noise span (s_a - s_b, mean over trained steps)",
             ylabel="|E d| / rms noise of full", title="JAGG's bias (subsample: none)")
    right.set(xlabel="window noise span", ylabel="rms per-rollout error / rms noise of full",
              title="per-rollout error at equal backward items")
    left.legend(fontsize=6, loc="lower right")
    right.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _main(args: Args) -> int:
    # a window_detail report repeats another column's rollouts (same seed) per window: rendered apart
    reports = [(path.stem, path) for path in sorted(Path(args.results).glob("*.json"))
               if not json.loads(path.read_text()).get("args", {}).get("window_detail")]
    reports += [(name, Path(path)) for name, _, path in (entry.partition("=") for entry in args.extra)]
    rows = [row for name, path in reports for row in map_rows(json.loads(path.read_text()), name)]
    if not rows:
        sys.stderr.write(f"bias_map: no report in {args.results} holds jagg and subsample rows\n")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True)
    (out / "map.json").write_text(json.dumps({"results": args.results, "extra": args.extra, "rows": rows}, indent=2) + "\n")
    (out / "map.md").write_text(table(rows) + "\n")
    figure(rows, out / "map.png")
    sys.stdout.write(table(rows) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli.run(_main, Args, PROG, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
