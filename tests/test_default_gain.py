"""experiments/default_gain.py on a tiny budget: trains every arm, evaluates next to the base."""
import json
import subprocess
import sys

from tests.test_train_cli import REPO

TINY_DATA = ["data.prompts_per_step=2", "data.group_size=4", "grpo.micro_batch_size=4", "sampler.num_steps=4"]


def test_default_gain_reports_each_arm_against_the_base(tmp_path):
    out = tmp_path / "gain"
    cmd = [sys.executable, "experiments/default_gain.py", "experiments=[jagg_w4]", "seeds=[0]", "minutes=0.05",
           "n_eval=6", f"out={out}", f"overrides=[{','.join(TINY_DATA)}]"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "gain.json").read_text())
    assert [(r["arm"], r["seed"]) for r in result["runs"]] == [
        ("base", "-"), ("jagg_w4", 0), ("jagg_w4+shuffled", 0)]
    assert all(r["steps"] >= 1 for r in result["runs"][1:])
    assert [a["arm"] for a in result["arms"]] == ["base", "jagg_w4", "jagg_w4+shuffled"]
    shuffled = (out / "jagg_w4_shuffled_seed0" / "config.yaml").read_text()
    assert "shuffle_advantages: true" in shuffled
    assert "| jagg_w4+shuffled | 1 |" in (out / "gain.md").read_text()
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "File exists" in again.stderr  # an earlier comparison is never overwritten


def test_tables_script_refuses_an_existing_output_directory(tmp_path):
    (tmp_path / "old").mkdir()
    proc = subprocess.run(["bash", "experiments/tables.sh", str(tmp_path / "old")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "already exists" in proc.stderr
