"""Paired gains: one evaluation against a reference evaluation of the same prompts and noise.

Both policies face the same samples, so the standard error of the per-sample difference is far
smaller than that of two independent accuracies. Evaluations are dicts as written by
`python -m jagg_lab.evaluate` (`args`, `strict_accuracy`, `dense_score`, `per_sample`).
"""
from __future__ import annotations

import statistics

from jagg_lab.evaluation.samples import eval_categories

__all__ = ["PAIRING_FREE", "paired_gain"]

# evaluate settings that may differ between two evaluations compared sample by sample: they
# name the policy or where outputs go; every other setting fixes the prompts, noise or sampler.
# A key an older evaluation lacks reads as None, so new settings default to None or sit here.
PAIRING_FREE = ("checkpoint", "out", "grid", "size", "run", "device", "base")


def paired_gain(result: dict, reference: dict) -> dict:
    """Scores of an evaluation and its gain over `reference`, an evaluation of the same prompts
    and noise, with the standard error of the paired per-sample difference; overall and per
    category of the evaluation prompts. Raises ValueError naming the settings that differ."""
    args, ref_args = result.get("args", {}), reference.get("args", {})
    differ = sorted(k for k in args.keys() | ref_args.keys() if k not in PAIRING_FREE and args.get(k) != ref_args.get(k))
    if differ:
        raise ValueError(f"evaluations are not on the same prompts and noise: {', '.join(f'{k} {args.get(k)!r} vs {ref_args.get(k)!r}' for k in differ)}")
    diffs = {key: [a - b for a, b in zip(result["per_sample"][key], reference["per_sample"][key], strict=True)]
             for key in ("strict", "dense")}
    categories = eval_categories(len(diffs["strict"]), ref_args.get("categories"))
    per_category = {category: _gains({key: [d for d, c in zip(diff, categories) if c == category] for key, diff in diffs.items()})
                    for category in dict.fromkeys(categories)}
    return {"strict_accuracy": result["strict_accuracy"], "dense_score": result["dense_score"], **_gains(diffs),
            "per_category": per_category}


def _gains(diffs: dict[str, list[float]]) -> dict[str, float]:
    """Mean and standard error of each list of paired differences, as KEY_gain and KEY_gain_se."""
    out = {}
    for key, diff in diffs.items():
        out[f"{key}_gain"] = statistics.fmean(diff)
        out[f"{key}_gain_se"] = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else 0.0
    return out
