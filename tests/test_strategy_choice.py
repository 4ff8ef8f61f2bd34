"""experiments/strategy_choice.py on made-up evaluations: per-seed paired gains, their mean and
seed std, the distance to the reference in its std, and the curve in backward items."""
import json
import statistics
import subprocess
import sys

import pytest

from tests.test_train_cli import REPO

ARGS = {"source": "policy", "n_samples": 6, "seed": 2, "split": "heldout", "resolution": 32, "num_steps": 20,
        "guidance": 3.0, "shift": 1.0, "noise_level": 0.0, "batch_size": 64}


def evaluation(strict: list[int], dense: list[float], checkpoint: str) -> dict:
    return {"args": {**ARGS, "checkpoint": checkpoint}, "n_samples": 6, "strict_accuracy": sum(strict) / 6,
            "dense_score": sum(dense) / 6, "per_sample": {"strict": strict, "dense": dense}}


def test_strategy_choice_tabulates_seed_spread_and_equal_item_curves(tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(evaluation([0] * 6, [0.5] * 6, "shipped")))
    gains = {"full": [0.1, 0.2, 0.3], "cheap": [0.05, 0.1]}  # dense gain per seed
    for arm, per_seed in gains.items():
        for seed, g in enumerate(per_seed):
            (tmp_path / f"{arm}_seed{seed}.json").write_text(json.dumps(evaluation([1, 0, 0, 0, 0, 0], [0.5 + g] * 6, arm)))
    curve = tmp_path / "gain.json"
    curve.write_text(json.dumps({"args": {"n_eval": 512, "curve_n_eval": 0},
                                 "runs": [{"arm": "cheap", "seed": s, "steps": 10, "backward_items": 3.0} for s in (0, 1)],
                                 "checkpoints": [{"arm": "cheap", "seed": s, "steps": 10, "strict_gain": 0.0, "dense_gain": 0.1 * (s + 1)}
                                                 for s in (0, 1)]}))
    (tmp_path / "metrics.csv").write_text("step,backward_items,time_gradient_s\n1,5,0.5\n2,3,0.5\n")  # a run's own record wins over gain.json's
    out = tmp_path / "choice"
    cmd = [sys.executable, "experiments/strategy_choice.py", f"base={base}",
           f"finals=[full={tmp_path}/full_seed*.json,cheap={tmp_path}/cheap_seed*.json]", f"gains=[{curve}]",
           "items=[full=6]", f"out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arms = {a["arm"]: a for a in json.loads((out / "choice.json").read_text())["arms"]}
    assert arms["full"]["items_per_step"] == 6  # given explicitly: wins over any record
    assert arms["full"]["dense_gain_mean"] == pytest.approx(0.2) and arms["full"]["dense_gain_std"] == pytest.approx(0.1)
    assert arms["cheap"]["seeds"] == 2 and arms["cheap"]["items_vs_reference"] == pytest.approx(4 / 6)
    assert arms["cheap"]["dense_vs_reference_in_std"] == pytest.approx((0.075 - 0.2) / 0.1)
    assert arms["cheap"]["strict_gain_std"] == pytest.approx(statistics.stdev([1 / 6, 1 / 6]))
    (row,) = json.loads((out / "choice.json").read_text())["curve"]
    assert (row["items"], row["dense_gain_mean"]) == (40.0, pytest.approx(0.15))
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwritten
