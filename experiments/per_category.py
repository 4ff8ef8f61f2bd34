"""Per-category gains over the base, mean and seed std over each arm's final policies.

    python experiments/per_category.py base=BASE.json "finals=[full=DIR/full_seed*.json,subsample_w6=DIR2/*/eval.json]" [out=FILE.json]

finals: NAME=GLOB, the `python -m jagg_lab.evaluate` outputs (or verdicts) of an arm's final
policies, one per training seed, on the same prompts and noise as `base`; an arm named twice
gathers both patterns. Prints a Markdown table: each category's base strict accuracy and, per
arm, the mean +- seed std of its strict gain; then the same for the dense score. `out` (never
overwritten) gets the numbers as JSON.
"""
from __future__ import annotations

import glob
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from jagg_lab import cli

from jagg_lab.evaluation.arms import load_evaluation as load, mean_std, named_pairs


@dataclass
class Args:
    base: str = "???"  # the base policy's evaluation on the same prompts and noise
    finals: list[str] = field(default_factory=list)  # NAME=GLOB, one evaluation per seed
    out: str | None = None  # JSON file for the numbers (never overwritten)


def per_category(args: Args) -> dict:
    if args.out and Path(args.out).exists():
        raise FileExistsError(f"out={args.out} already exists; choose another path")
    patterns: dict[str, list[str]] = {}
    for name, pattern in named_pairs(args.finals, "finals"):
        patterns.setdefault(name, []).append(pattern)
    if not patterns:
        raise ValueError("finals is empty: pass \"finals=[NAME=GLOB,...]\"")
    empty = [f"{name}={p}" for name, ps in patterns.items() for p in ps if not glob.glob(p)]
    if empty:
        raise FileNotFoundError(f"finals: no file matches {', '.join(empty)}")
    base = load(args.base, verdict=False)
    report = {"base": args.base, "categories": {}, "arms": {}}
    for name, ps in patterns.items():
        files = sorted({f for p in ps for f in glob.glob(p)})
        results = [load(f) for f in files]
        for path, result in zip(files, results):
            if result["args"].get("seed") != base["args"].get("seed") or result["args"].get("n_samples") != base["args"].get("n_samples"):
                raise ValueError(f"finals: {path} was not evaluated on the base's prompts and noise (n_samples, seed)")
        report["arms"][name] = {"files": files, "per_category": {}}
        for category, scores in base["per_category"].items():
            report["categories"][category] = scores
            row = {}
            for metric in ("strict_accuracy", "dense_score"):
                gains = [r["per_category"][category][metric] - scores[metric] for r in results]
                row[metric] = dict(zip(("mean", "std"), mean_std(gains)), seeds=len(gains))
            report["arms"][name]["per_category"][category] = row
    return report


def table(report: dict, metric: str) -> str:
    arms = list(report["arms"])
    lines = [f"| category | base | {' | '.join(f'`{a}`' for a in arms)} |", "|---|---|" + "---|" * len(arms)]
    for category, base in report["categories"].items():
        cells = [f"{report['arms'][a]['per_category'][category][metric]['mean']:+.3f} +- "
                 f"{report['arms'][a]['per_category'][category][metric]['std']:.3f}" for a in arms]
        lines.append(f"| {category} | {base[metric]:.3f} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _main(args: Args) -> int:
    report = per_category(args)
    seeds = {a: len(v["files"]) for a, v in report["arms"].items()}
    sys.stdout.write(f"strict gain over the base per category, mean +- seed std ({seeds} seeds)\n\n"
                     f"{table(report, 'strict_accuracy')}\n\ndense gain\n\n{table(report, 'dense_score')}\n")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(_main, Args, "python experiments/per_category.py", sys.argv[1:]))
