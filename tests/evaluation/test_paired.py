"""Paired comparisons of evaluations: jagg_lab.evaluation.paired_gain and experiments/paired.py."""
import json
import statistics
import subprocess
import sys
from dataclasses import asdict

import pytest

from jagg_lab.evaluate import EvalArgs, main as evaluate
from jagg_lab.evaluation import eval_categories, eval_prompts, paired_gain
from jagg_lab.worlds.shapes import CATEGORIES, parse
from tests.test_train_cli import REPO


def _evaluation(strict: list[int], dense: list[float], **args) -> dict:
    return {"args": {"seed": 1, "n_samples": len(strict), "checkpoint": "a", **args},
            "strict_accuracy": statistics.fmean(strict), "dense_score": statistics.fmean(dense),
            "per_sample": {"strict": strict, "dense": dense}}


def test_paired_gain_is_the_mean_difference_with_its_standard_error():
    policy = _evaluation([1, 1, 0, 1], [1.0, 0.9, 0.5, 0.8], checkpoint="b")
    base = _evaluation([0, 1, 0, 0], [0.5, 0.9, 0.5, 0.6])
    gain = paired_gain(policy, base)
    assert gain["strict_gain"] == pytest.approx(0.5) and gain["dense_gain"] == pytest.approx(0.175)
    assert gain["strict_gain_se"] == pytest.approx(statistics.stdev([1, 0, 0, 1]) / 2)
    assert gain["dense_gain_se"] == pytest.approx(statistics.stdev([0.5, 0.0, 0.0, 0.2]) / 2)
    # a policy against itself: no difference and no error
    assert paired_gain(base, base)["strict_gain_se"] == 0.0


def test_paired_gain_per_category_follows_the_evaluation_prompts_order():
    n = 2 * len(CATEGORIES)
    categories = eval_categories(n)
    assert [parse(p).category for p in eval_prompts(n, seed=3)] == categories
    # a policy that gains only on single objects: the whole gain sits in that category
    policy = _evaluation([int(c == "single_object") for c in categories], [float(c == "single_object") for c in categories])
    gain = paired_gain(policy, _evaluation([0] * n, [0.0] * n))["per_category"]
    assert list(gain) == list(CATEGORIES)
    assert gain["single_object"]["strict_gain"] == 1.0 and gain["single_object"]["dense_gain_se"] == 0.0
    assert all(gain[c]["strict_gain"] == 0.0 for c in CATEGORIES if c != "single_object")


def test_paired_gain_refuses_evaluations_of_other_prompts_or_noise():
    with pytest.raises(ValueError, match="seed 2 vs 1"):
        paired_gain(_evaluation([1], [1.0], seed=2), _evaluation([0], [0.5]))
    with pytest.raises(ValueError):  # same settings but a different number of samples
        paired_gain(_evaluation([1, 0], [1.0, 0.0], n_samples=1), _evaluation([0], [0.5]))


def test_paired_cli_compares_real_evaluations_and_their_mean(tmp_path):
    paths = {}
    # the shipped policy, and a random-init XS one on the same prompts and noise (and on other ones)
    for name, policy, seed in (("base", [], 1), ("rand", ["size=XS", "checkpoint=null"], 1),
                               ("rand_s2", ["size=XS", "checkpoint=null"], 2)):
        paths[name] = tmp_path / f"{name}.json"
        assert evaluate(["source=policy", "n_samples=6", f"seed={seed}", "num_steps=4", *policy, f"out={paths[name]}"]) == 0
    out = tmp_path / "cmp.json"
    cmd = [sys.executable, "experiments/paired.py", f"reference={paths['base']}",
           f"evaluations=[{paths['rand']},{paths['base']}]", f"out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    base, rand = (json.loads(paths[n].read_text()) for n in ("base", "rand"))
    assert rows[0]["strict_gain"] == pytest.approx(rand["strict_accuracy"] - base["strict_accuracy"])
    assert rows[1]["strict_gain"] == 0 and rows[1]["dense_gain_se"] == 0
    assert rows[2]["evaluation"] == "mean of 2"
    assert rows[2]["dense_gain"] == pytest.approx((rand["dense_score"] - base["dense_score"]) / 2)
    assert "| mean of 2 |" in proc.stdout and "strict gain per category" in proc.stdout
    assert set(rows[0]["per_category"]) == set(CATEGORIES)
    # the same out again is refused, and so is an evaluation of other prompts: both name what is wrong
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    proc = subprocess.run([*cmd[:3], f"evaluations=[{paths['rand_s2']}]"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "rand_s2.json" in proc.stderr and "seed 2 vs 1" in proc.stderr
    proc = subprocess.run([*cmd[:3], f"evaluations=[{tmp_path / 'missing.json'}]"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "missing.json" in proc.stderr


def test_the_shipped_base_evaluation_is_a_paired_reference():
    """experiments/results/base_eval.json (the README's base numbers) holds per-sample scores and
    the settings of a default evaluation: any policy evaluated with n_samples=128 seed=1 pairs with it."""
    base = json.loads((REPO / "experiments" / "results" / "base_eval.json").read_text())
    strict, dense = base["per_sample"]["strict"], base["per_sample"]["dense"]
    assert len(strict) == len(dense) == base["n_samples"] == 128
    assert statistics.fmean(strict) == pytest.approx(base["strict_accuracy"])
    assert statistics.fmean(dense) == pytest.approx(base["dense_score"])
    other = {"args": asdict(EvalArgs(checkpoint="trained.safetensors", out="trained.json")), "strict_accuracy": 1.0,
             "dense_score": 1.0, "per_sample": {"strict": [1] * 128, "dense": [1.0] * 128}}
    assert paired_gain(other, base)["strict_gain"] == pytest.approx(1 - base["strict_accuracy"])
