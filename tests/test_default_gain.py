"""experiments/default_gain.py on a tiny budget: trains every arm, evaluates next to the base."""
import json
import statistics
import subprocess
import sys

import pytest

from tests.test_train_cli import REPO

TINY_DATA = ["data.prompts_per_step=2", "data.group_size=4", "grpo.micro_batch_size=4", "sampler.num_steps=4"]


def test_default_gain_reports_each_arm_and_checkpoint_against_the_base(tmp_path):
    out = tmp_path / "gain"
    cmd = [sys.executable, "experiments/default_gain.py", "experiments=[jagg_w4]", "seeds=[0]", "max_steps=2",
           "n_eval=6", f"out={out}", f"overrides=[{','.join(TINY_DATA)},checkpoint_every=1]"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "gain.json").read_text())
    assert [(r["arm"], r["seed"], r["steps"]) for r in result["runs"]] == [
        ("base", "-", 0), ("jagg_w4", 0, 2), ("jagg_w4+shuffled", 0, 2)]
    # the step-1 checkpoint is scored too; the step-2 one is the final policy, scored once
    assert [(r["arm"], r["steps"]) for r in result["checkpoints"]] == [
        ("jagg_w4", 1), ("jagg_w4", 2), ("jagg_w4+shuffled", 1), ("jagg_w4+shuffled", 2)]
    base = json.loads((out / "base.json").read_text())
    for row in result["runs"][1:]:
        scored = json.loads((out / f"{row['arm'].replace('+', '_')}_seed0" / "eval.json").read_text())
        diff = [a - b for a, b in zip(scored["per_sample"]["strict"], base["per_sample"]["strict"])]
        assert row["strict_gain"] == pytest.approx(sum(diff) / 6)
        assert row["strict_gain"] == pytest.approx(scored["strict_accuracy"] - base["strict_accuracy"])
        assert row["strict_gain_se"] == pytest.approx(statistics.stdev(diff) / 6**0.5)
    assert result["runs"][0]["strict_gain"] == 0 and result["runs"][0]["strict_gain_se"] == 0
    assert all(r["backward_items"] > 0 and r["gradient_s"] > 0 for r in result["runs"][1:])  # each run's cost, for equal-time views
    real, control = (json.loads((out / f"{d}_seed0" / "eval.json").read_text()) for d in ("jagg_w4", "jagg_w4_shuffled"))
    assert [(r["seed"], r["steps"]) for r in result["vs_control"]] == [(0, 1), (0, 2)]
    assert result["vs_control"][1]["dense_gain"] == pytest.approx(real["dense_score"] - control["dense_score"])
    assert "minus its shuffled control" in (out / "gain.md").read_text()
    assert [a["arm"] for a in result["arms"]] == ["base", "jagg_w4", "jagg_w4+shuffled"]
    shuffled = (out / "jagg_w4_shuffled_seed0" / "config.yaml").read_text()
    assert "shuffle_advantages: true" in shuffled
    assert "| jagg_w4+shuffled | 1 |" in (out / "gain.md").read_text()
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "File exists" in again.stderr  # an earlier comparison is never overwritten


def test_a_reused_base_evaluation_must_score_the_same_samples(tmp_path):
    stored = next((REPO / "jagg_lab" / "assets" / "heldout").glob("*_n2048_seed2.json"))
    cmd = [sys.executable, "experiments/default_gain.py", "experiments=[full]", "n_eval=512", "eval_seed=2",
           f"base_eval={stored}", f"out={tmp_path / 'gain'}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "base_eval" in proc.stderr and "n_eval=512" in proc.stderr
    assert not (tmp_path / "gain").exists()  # refused before anything is written


def test_a_reused_curve_base_must_score_the_curve_set(tmp_path):
    stored = next((REPO / "jagg_lab" / "assets" / "heldout").glob("*_n2048_seed2.json"))
    cmd = [sys.executable, "experiments/default_gain.py", "experiments=[full]", f"curve_base_eval={stored}", f"out={tmp_path / 'gain'}"]
    for extra, why in ((["curve_n_eval=512", "curve_eval_seed=2"], "curve_n_eval=512"), ([], "give curve_n_eval")):
        proc = subprocess.run([*cmd, *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and "curve_base_eval" in proc.stderr and why in proc.stderr
        assert not (tmp_path / "gain").exists()  # refused before anything is written


def test_tables_script_refuses_an_existing_output_directory(tmp_path):
    (tmp_path / "old").mkdir()
    proc = subprocess.run(["bash", "experiments/tables.sh", str(tmp_path / "old")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "already exists" in proc.stderr
