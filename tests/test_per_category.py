"""experiments/per_category.py on made-up evaluations: each category's gain, mean and seed std."""
import json
import subprocess
import sys

import pytest

from tests.test_train_cli import REPO


def evaluation(per_category: dict[str, float], seed: int = 2) -> dict:
    return {"args": {"n_samples": 4, "seed": seed}, "per_sample": {"strict": [0] * 4, "dense": [0.0] * 4},
            "per_category": {c: {"n": 2, "strict_accuracy": v, "dense_score": v / 2} for c, v in per_category.items()}}


def run(tmp_path, *argv):
    return subprocess.run([sys.executable, "experiments/per_category.py", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_per_category_gains_over_seeds(tmp_path):
    (tmp_path / "base.json").write_text(json.dumps(evaluation({"counting": 0.5, "position": 0.0})))
    for seed, (counting, position) in enumerate([(0.7, 0.0), (0.9, 0.5)]):
        final = evaluation({"counting": counting, "position": position})
        # seed 1 as a training run's verdict file leaves it: heldout_final.json, the evaluation under "final"
        content = final if seed == 0 else {"step": 100, "final": final, "base": evaluation({"counting": 0.5, "position": 0.0})}
        (tmp_path / f"arm_seed{seed}.json").write_text(json.dumps(content))
    out = tmp_path / "out.json"
    proc = run(tmp_path, f"base={tmp_path / 'base.json'}", f"finals=[arm={tmp_path}/arm_seed*.json]", f"out={out}")
    assert proc.returncode == 0, proc.stderr
    cells = json.loads(out.read_text())["arms"]["arm"]["per_category"]
    assert cells["counting"]["strict_accuracy"]["mean"] == pytest.approx(0.3)
    assert cells["counting"]["strict_accuracy"]["std"] == pytest.approx(0.1414, abs=1e-4)
    assert cells["position"]["dense_score"]["mean"] == pytest.approx(0.125)
    assert "| counting | 0.500 | +0.300 +- 0.141 |" in proc.stdout


def test_an_evaluation_of_other_prompts_is_refused(tmp_path):
    (tmp_path / "base.json").write_text(json.dumps(evaluation({"counting": 0.5})))
    (tmp_path / "arm.json").write_text(json.dumps(evaluation({"counting": 0.5}, seed=1)))
    proc = run(tmp_path, f"base={tmp_path / 'base.json'}", f"finals=[arm={tmp_path}/arm.json]")
    assert proc.returncode != 0 and "base's prompts and noise" in proc.stderr


def test_a_runs_verdict_file_is_refused_as_the_base(tmp_path):
    # heldout_final.json holds the trained policy under "final": as the base it would be compared with itself
    verdict = {"step": 100, "final": evaluation({"counting": 0.7}), "base": evaluation({"counting": 0.5})}
    (tmp_path / "heldout_final.json").write_text(json.dumps(verdict))
    proc = run(tmp_path, f"base={tmp_path / 'heldout_final.json'}", f"finals=[arm={tmp_path}/heldout_final.json]")
    assert proc.returncode != 0 and "verdict" in proc.stderr and "reference" in proc.stderr
