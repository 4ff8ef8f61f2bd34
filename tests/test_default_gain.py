"""experiments/default_gain.py on a tiny budget: trains every arm, evaluates next to the base."""
import json
import statistics
import subprocess
import sys

import pytest

from tests.scripts import load_script
from tests.test_train_cli import REPO, read_rows

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


def _default_gain(monkeypatch):
    monkeypatch.chdir(REPO)  # `python -m tests.faults` below
    return load_script("default_gain", monkeypatch)


@pytest.mark.slow  # a training run, its resumption and five evaluations: about a minute
def test_a_cut_comparison_resumes_its_killed_run_and_reuses_what_was_scored(tmp_path, monkeypatch):
    """The training run is killed while writing last.ckpt of step 3 (last.ckpt stays at step 2,
    metrics.csv already holds step 3): `resume=true` keeps the base's evaluation, resumes the run
    from step 2 into RUN_DIR_resumed1 and counts step 3 once."""
    gain = _default_gain(monkeypatch)
    out = tmp_path / "gain"
    argv = ["experiments=[jagg_w4]", "seeds=[0]", "control=false", "max_steps=3", "n_eval=4", "minutes=5", f"out={out}",
            f"overrides=[{','.join(TINY_DATA)},checkpoint_every=1,checkpoint_every_minutes=0.000001]"]  # last.ckpt at every step
    calls: list[list[str]] = []
    first = gain.run

    def killed_training(cmd):
        calls.append(cmd)
        if cmd[:2] == ["-m", "jagg_lab.train"]:
            cmd = ["-m", "tests.faults", "last_write", "3", "KILL", *cmd[2:]]
        first(cmd)

    monkeypatch.setattr(gain, "run", killed_training)
    with pytest.raises(subprocess.CalledProcessError):
        gain.main(argv)
    run_dir = out / "jagg_w4_seed0"
    assert len(read_rows(run_dir / "metrics.csv")) == 3 and not (out / "gain.json").exists()
    with pytest.raises(SystemExit, match="other settings: n_eval=4"):
        gain.main([*argv, "n_eval=5", "resume=true"])  # refused, nothing run
    assert not (out / "jagg_w4_seed0_resumed1").exists()

    calls.clear()
    monkeypatch.setattr(gain, "run", lambda cmd: (calls.append(cmd), first(cmd)))
    assert gain.main([*argv, "resume=true"]) == 0
    resumed = out / "jagg_w4_seed0_resumed1"
    assert [int(r["step"]) for r in read_rows(resumed / "metrics.csv")] == [3]
    (train_cmd,) = [c for c in calls if c[:2] == ["-m", "jagg_lab.train"]]
    assert f"resume={run_dir / 'checkpoints' / 'last.ckpt'}" in train_cmd and f"hydra.run.dir={resumed}" in train_cmd
    scored = [next(a for a in c if a.startswith("checkpoint=")) for c in calls if c[:2] == ["-m", "jagg_lab.evaluate"]]
    ckpts = run_dir / "checkpoints"  # the base was scored before the cut, and is not scored again
    assert scored == [f"checkpoint={ckpts / 'step_000001.ckpt'}", f"checkpoint={ckpts / 'step_000002.ckpt'}",
                      f"checkpoint={resumed / 'policy.safetensors'}"]
    result = json.loads((out / "gain.json").read_text())
    (row,) = result["runs"][1:]
    assert row["steps"] == 3 and [r["steps"] for r in result["checkpoints"]] == [1, 2, 3]
    times = [float(r["time_gradient_s"]) for r in read_rows(run_dir / "metrics.csv")[:2] + read_rows(resumed / "metrics.csv")]
    assert row["gradient_s"] == pytest.approx(sum(times))  # the killed part's step 3 is counted once, from its rerun
    assert json.loads((run_dir / "eval.json").read_text())["args"]["checkpoint"] == str(resumed / "policy.safetensors")
    with pytest.raises(SystemExit, match="finished comparison"):
        gain.main([*argv, "resume=true"])


def test_a_run_cut_after_its_last_step_is_kept_and_an_evaluation_of_the_same_samples_reused(tmp_path, monkeypatch):
    """Kept, not resumed: a run stopped by a signal after (or during) its last step, and one
    killed once its last.ckpt held the step cap or the time budget (scored from that checkpoint
    when the kill came before the export); resumed: one whose last.ckpt is short of both."""
    import torch
    gain = _default_gain(monkeypatch)
    launched = []
    monkeypatch.setattr(gain, "run", launched.append)
    args, command = gain.Args(resume=True, max_steps=2), ["-m", "jagg_lab.train"]

    def cut(name, summary=None, step=None, elapsed=0.0):
        run_dir = tmp_path / "gain" / name
        (run_dir / "checkpoints").mkdir(parents=True)
        (run_dir / "metrics.csv").write_text("step,time_gradient_s,backward_items\n1,1.0,4\n2,1.5,4\n")
        if summary is not None:
            (run_dir / "summary.json").write_text(json.dumps(summary))
        if step is not None:
            torch.save({"global_step": step, "callbacks": {"Timer": {"time_elapsed": {"train": elapsed}}}},
                       run_dir / "checkpoints" / "last.ckpt")
        return run_dir

    signalled = cut("signalled", {"steps": 2, "interrupted": "SIGTERM", "unfinished": []})
    assert gain.train(args, signalled, command, budget_s=60) == [signalled]
    assert gain.gradient_phase(signalled) == {"steps": 2, "gradient_s": 2.5, "backward_items": 4.0}
    at_cap = cut("at_cap", step=2)  # killed before the export
    assert gain.train(args, at_cap, command, budget_s=60) == [at_cap]
    assert gain.final_policy([at_cap]) == at_cap / "checkpoints" / "last.ckpt"
    out_of_time = cut("out_of_time", {"steps": 1, "interrupted": "SIGTERM"}, step=1, elapsed=61.0)
    assert gain.train(args, out_of_time, command, budget_s=60) == [out_of_time] and not launched
    short = cut("short", {"steps": 1, "interrupted": "SIGTERM"}, step=1, elapsed=30.0)
    assert gain.train(args, short, command, budget_s=60) == [short, tmp_path / "gain" / "short_resumed1"]
    assert launched == [[*command, f"resume={short / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={short}_resumed1"]]

    from dataclasses import asdict
    from jagg_lab.evaluate import EvalArgs
    policy = str(signalled / "policy.safetensors")
    scored = {"args": asdict(EvalArgs(n_samples=8, seed=2, checkpoint=policy, out="elsewhere.json")), "strict_accuracy": 0.5}
    (signalled / "eval.json").write_text(json.dumps(scored))
    assert gain.evaluate(signalled / "eval.json", policy, 8, 2) == scored and len(launched) == 1  # reused, not run
    gain.evaluate(signalled / "eval.json", policy, 8, 3)  # other samples: scored again
    assert launched[-1][:2] == ["-m", "jagg_lab.evaluate"] and "seed=3" in launched[-1]
    scored["args"]["num_steps"] = 10  # sampled otherwise (an evaluation default changed since): scored again
    (signalled / "eval.json").write_text(json.dumps(scored))
    gain.evaluate(signalled / "eval.json", policy, 8, 2)
    assert len(launched) == 3


def test_the_gradient_phase_of_a_resumed_run_counts_each_step_once(tmp_path, monkeypatch):
    """Parts cut where the next begins: the first logged step 3 before it was killed (its
    last.ckpt held step 2), the second was killed before its first step (no metrics.csv), the
    third ran steps 3 and 4 again."""
    gain = _default_gain(monkeypatch)
    parts = [tmp_path / "run", tmp_path / "run_resumed1", tmp_path / "run_resumed2"]
    for part in parts:
        part.mkdir()
    header = "step,time_gradient_s,backward_items\n"
    (parts[0] / "metrics.csv").write_text(header + "1,1.0,4\n2,1.0,4\n3,9.0,9\n")
    (parts[2] / "metrics.csv").write_text(header + "3,2.0,2\n4,2.0,2\n")
    assert gain.gradient_phase(parts[0], parts) == {"steps": 4, "gradient_s": 6.0, "backward_items": 3.0}
    assert gain.gradient_phase(parts[1], parts[1:2]) == {"steps": 0, "gradient_s": 0.0, "backward_items": 0.0}
    # a part killed before its first step may also leave an empty file, or a header alone
    (parts[1] / "metrics.csv").write_text("")
    assert gain.gradient_phase(parts[0], parts)["steps"] == 4
    (parts[1] / "metrics.csv").write_text(header)
    steps = gain.run_metrics(parts)["step"]
    assert steps.tolist() == [1, 2, 3, 4] and steps.dtype.kind == "i"  # no empty frame joined: not `object`
    (parts[2] / "metrics.csv").write_text("step,backward_items\n3,2\n")
    with pytest.raises(ValueError, match="run_resumed2/metrics.csv: no time_gradient_s column"):
        gain.gradient_phase(parts[0], parts)
