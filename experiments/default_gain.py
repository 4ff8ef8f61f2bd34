"""Does the default experiment improve the base policy within a CPU budget?

    python experiments/default_gain.py experiments=full,jagg_w4 seeds=0 minutes=15 n_eval=128 out=outputs/gain

For each experiment x seed: train `python -m jagg_lab.train +experiment=E seed=S` for at most
`minutes` of wall time, then score the trained policy with `python -m jagg_lab.evaluate`
(ODE, held-out prompts, fixed seeds) next to the shipped base policy; writes
`OUT/gain.json` and a Markdown table `OUT/gain.md`.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf


@dataclass
class Args:
    experiments: list[str] = field(default_factory=lambda: ["full", "jagg_w4"])
    seeds: list[int] = field(default_factory=lambda: [0])
    minutes: float = 15.0
    n_eval: int = 128
    eval_seed: int = 1
    out: str = "outputs/gain"
    overrides: list[str] = field(default_factory=list)  # extra training overrides, e.g. ["optimizer.lr=1e-4"]


def run(cmd: list[str]) -> None:
    subprocess.run([sys.executable, *cmd], check=True)


def evaluate(out_json: Path, args: Args, checkpoint: str) -> dict:
    run(["-m", "jagg_lab.evaluate", "source=policy", f"n_samples={args.n_eval}", f"seed={args.eval_seed}",
         f"checkpoint={checkpoint}", f"out={out_json}"])
    return json.loads(out_json.read_text())


def main() -> None:
    args = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Args), OmegaConf.from_cli(sys.argv[1:])))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=False)  # never overwrite an earlier comparison
    h, m = divmod(int(args.minutes * 60), 3600)
    budget = f"00:{h:02d}:{m // 60:02d}:{m % 60:02d}"
    rows = [{"experiment": "base", "seed": "-", **_summary(evaluate(out / "base.json", args, "shipped"))}]
    for experiment in args.experiments:
        for seed in args.seeds:
            run_dir = out / f"{experiment}_seed{seed}"
            run(["-m", "jagg_lab.train", f"+experiment={experiment}", f"seed={seed}", f"trainer.max_time={budget}",
                 "trainer.max_steps=100000", f"hydra.run.dir={run_dir}", *args.overrides])
            result = evaluate(run_dir / "eval.json", args, str(run_dir / "policy.safetensors"))
            rows.append({"experiment": experiment, "seed": seed, **_summary(result)})
    (out / "gain.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = ["| experiment | seed | held-out strict | dense |", "|---|---|---|---|"]
    lines += [f"| {r['experiment']} | {r['seed']} | {r['strict_accuracy']:.3f} | {r['dense_score']:.3f} |" for r in rows]
    (out / "gain.md").write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")


def _summary(result: dict) -> dict:
    return {"strict_accuracy": result["strict_accuracy"], "dense_score": result["dense_score"]}


if __name__ == "__main__":
    main()
