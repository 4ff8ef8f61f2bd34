"""Paired comparison of `python -m jagg_lab.evaluate` outputs on the same prompts and noise.

    python experiments/paired.py reference=base.json "evaluations=[seed0.json,seed1.json,seed2.json]" [out=FILE.json]

Prints, for each evaluation, its scores and its gain over the reference with the standard error
of the paired per-sample difference (overall, then per prompt category), then the same for
their mean (per-sample scores averaged over the evaluations, e.g. over the training seeds of
one experiment). The evaluations must
share every evaluate setting but those naming the policy or the outputs (`checkpoint`, `size`,
`run`, `device`, `out`, `grid`: jagg_lab.evaluation.PAIRING_FREE); anything else is an error
that names the differing keys. A training run's verdict file (`heldout_final.json`) may stand for
an evaluation (not for the reference): the scores of the policy it graded are read. `out` (never overwritten) gets the rows as JSON.
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from jagg_lab import cli
from jagg_lab.evaluation import paired_gain
from jagg_lab.evaluation.arms import load_evaluation as load


@dataclass
class Args:
    reference: str = "???"  # the evaluation the others are compared with (e.g. the base policy's)
    evaluations: list[str] = field(default_factory=list)  # evaluations of the same prompts and noise
    out: str | None = None  # JSON file for the rows (never overwritten)


def mean_evaluation(results: list[dict]) -> dict:
    """One evaluation whose per-sample scores are the average over `results` (same prompts and noise)."""
    per_sample = {key: [statistics.fmean(scores) for scores in zip(*(r["per_sample"][key] for r in results), strict=True)]
                  for key in ("strict", "dense")}
    return {"args": results[0]["args"], "strict_accuracy": statistics.fmean(per_sample["strict"]),
            "dense_score": statistics.fmean(per_sample["dense"]), "per_sample": per_sample}


def compare(args: Args) -> tuple[int, list[dict]]:
    """The number of samples, and a row per evaluation (then their mean) with its gain over the reference."""
    if not args.evaluations:
        raise ValueError("evaluations is empty: pass \"evaluations=[a.json,...]\"")
    if args.out and Path(args.out).exists():
        raise FileExistsError(f"out={args.out} already exists; choose another path")
    reference = load(args.reference, verdict=False)
    results = [load(path) for path in args.evaluations]
    rows = []
    for path, result in zip(args.evaluations, results):
        try:
            rows.append({"evaluation": path, **paired_gain(result, reference)})
        except ValueError as err:
            raise ValueError(f"{path} vs reference {args.reference}: {err}") from None
    if len(results) > 1:
        rows.append({"evaluation": f"mean of {len(results)}", **paired_gain(mean_evaluation(results), reference)})
    return len(reference["per_sample"]["strict"]), rows


def report(args: Args) -> int:
    try:
        n, rows = compare(args)
    except (ValueError, OSError) as err:
        sys.stderr.write(f"paired.py: {err}\n")
        return 2
    lines = [f"gain over {args.reference} (n = {n}) +- the standard error of the paired per-sample difference", "",
             "| evaluation | strict | gain | dense | gain |", "|---|---|---|---|---|"]
    lines += [f"| {r['evaluation']} | {r['strict_accuracy']:.3f} | {r['strict_gain']:+.3f} +- {r['strict_gain_se']:.3f} "
              f"| {r['dense_score']:.3f} | {r['dense_gain']:+.3f} +- {r['dense_gain_se']:.3f} |" for r in rows]
    categories = list(rows[0]["per_category"])
    lines += ["", "strict gain per category:", "", f"| evaluation | {' | '.join(categories)} |", f"|---|{'---|' * len(categories)}"]
    lines += [f"| {r['evaluation']} | " + " | ".join(f"{r['per_category'][c]['strict_gain']:+.3f} +- {r['per_category'][c]['strict_gain_se']:.3f}"
                                                   for c in categories) + " |" for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps({"reference": args.reference, "n_samples": n, "rows": rows}, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli.run(report, Args, "python experiments/paired.py", argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
