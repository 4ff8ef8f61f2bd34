"""The training CLI end to end, in a subprocess, as a user runs it."""
import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = ["policy=dit_xs", "data.prompts_per_step=2", "data.group_size=4", "grpo.micro_batch_size=4", "sampler.num_steps=4"]
COLUMNS = {
    "step", "reward_mean", "reward_std", "loss", "clip_frac", "approx_kl", "grad_norm",
    "time_rollout_s", "time_reward_s", "time_gradient_s", "backward_passes", "rollout_forwards",
}


def train(*overrides, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "jagg_lab.train", *overrides], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def read_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_two_step_run_writes_metrics_samples_and_checkpoints(tmp_path):
    run = tmp_path / "run"
    proc = train("+experiment=full", "trainer.max_steps=2", "sample_every=1", f"hydra.run.dir={run}", *TINY)
    rows = read_rows(run / "metrics.csv")
    assert len(rows) == 2 and COLUMNS <= set(rows[0])
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["step", "reward_mean", "reward_std", "loss", "grad_norm"]  # then the rest, by name
    assert "weights_only" not in proc.stdout + proc.stderr  # Lightning's note at each checkpoint write
    # The exported policy is readable as every other file is (safetensors' own writes are 0600).
    assert len({(run / name).stat().st_mode & 0o777 for name in ("policy.safetensors", "config.yaml", "metrics.csv")}) == 1
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert all(float(r["backward_passes"]) == 3 * 2 for r in rows)  # ceil(0.6 * 4) trained steps x 2 micro-batches
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "config.yaml").is_file()
    assert list((run / "samples").glob("*.png"))
    assert (run / "policy.safetensors").is_file()  # evaluate checkpoint=RUN/policy.safetensors
    # a second run into the same directory is refused and leaves the first intact
    before = (run / "metrics.csv").read_text()
    proc = train("+experiment=full", "trainer.max_steps=1", f"hydra.run.dir={run}", *TINY, check=False)
    assert proc.returncode != 0 and "already holds a run" in proc.stderr
    assert (run / "metrics.csv").read_text() == before


def test_jagg_run_counts_one_backward_per_window(tmp_path):
    run = tmp_path / "run"
    train("+experiment=jagg_w4", "trainer.max_steps=1", "grpo.train_fraction=1.0", "sampler.num_steps=8",
          f"hydra.run.dir={run}", *TINY[:-1])
    row = read_rows(run / "metrics.csv")[0]
    assert float(row["backward_passes"]) == 2 * 2  # 2 windows x 2 micro-batches


def test_bad_config_exits_nonzero_naming_the_key(tmp_path):
    proc = train("+experiment=jagg_w4", "strategy.window=0", f"hydra.run.dir={tmp_path / 'r'}", check=False)
    assert proc.returncode != 0 and "window" in proc.stderr
    assert not (tmp_path / "r").exists()
    proc = train("no_such_key=1", f"hydra.run.dir={tmp_path / 'r2'}", check=False)
    assert proc.returncode != 0 and "no_such_key" in proc.stderr


def test_a_bad_value_is_one_line_on_stderr_naming_its_key_and_its_type(tmp_path):
    proc = train("sampler.num_steps=abc", f"hydra.run.dir={tmp_path / 'r'}", *TINY[:-1], check=False)
    assert proc.returncode == 1 and "num_steps" not in proc.stdout  # printed once, on stderr
    assert [line for line in proc.stderr.splitlines() if "invalid configuration" in line] == [
        "jagg_lab.train: invalid configuration: sampler.num_steps must be int, got 'abc'"]
    assert not (tmp_path / "r").exists()


def test_a_schedule_the_policy_lacks_leaves_no_run_directory(tmp_path):
    proc = train("sampler.schedule=pipeline", f"hydra.run.dir={tmp_path / 'r'}", *TINY, check=False)
    assert proc.returncode == 1 and "sampler.schedule=pipeline, but this policy" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


def test_several_optimizer_steps_per_rollout_with_kl_and_ema(tmp_path):
    """The second optimizer step on a rollout is off-policy: cached JAGG falls back to
    recompute (counted), and the policy has moved away from the KL reference."""
    run = tmp_path / "run"
    train("+experiment=jagg_w4", "reward=jpeg", "trainer.max_steps=2", "grpo.optimizer_steps_per_rollout=2", "grpo.beta=0.1",
          "grpo.ema_decay=0.9", "optimizer.lr=1e-3", f"hydra.run.dir={run}", *TINY)
    first, second = read_rows(run / "metrics.csv")
    assert float(first["fallbacks"]) == 0 and float(second["fallbacks"]) > 0
    assert float(first["kl"]) == 0 and float(second["kl"]) > 0
    assert float(second["time_rollout_s"]) == 0  # both steps share one rollout


def test_resume_continues_exactly_and_same_seed_is_deterministic(tmp_path):
    common = ["+experiment=subsample_w4", "reward=jpeg", "sampler.num_steps=8", "grpo.train_fraction=1.0",
              "optimizer.lr=1e-3", "checkpoint_every=2", *TINY[:-1]]
    train(*common, "trainer.max_steps=4", f"hydra.run.dir={tmp_path / 'straight'}")
    train(*common, "trainer.max_steps=4", f"hydra.run.dir={tmp_path / 'again'}")
    train(*common, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'first'}")
    train(*common, "trainer.max_steps=4", f"resume={tmp_path / 'first' / 'checkpoints' / 'last.ckpt'}",
          f"hydra.run.dir={tmp_path / 'second'}")
    keys = ("step", "reward_mean", "loss", "grad_norm")
    straight = read_rows(tmp_path / "straight" / "metrics.csv")
    again = read_rows(tmp_path / "again" / "metrics.csv")
    resumed = read_rows(tmp_path / "second" / "metrics.csv")
    assert [[r[k] for k in keys] for r in straight] == [[r[k] for k in keys] for r in again]
    assert [int(r["step"]) for r in resumed] == [3, 4]
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in straight[2:]]


def test_corrupt_checkpoint_is_rejected_before_any_work(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    proc = train(f"resume={bad}", f"hydra.run.dir={tmp_path / 'r'}", *TINY, check=False)
    assert proc.returncode != 0 and "not a readable checkpoint" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_an_ode_tail_records_itself_in_the_config_and_its_forwards_in_the_metrics(tmp_path):
    run = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith("sampler.num_steps")]
    train("+experiment=jagg_causal_w4", "trainer.max_steps=1", "sample_every=0", "heldout.n_samples=0", f"hydra.run.dir={run}",
          "sampler.num_steps=6", "sampler.tail_solver=euler", "sampler.tail_steps=1", *tiny)
    (row,) = read_rows(run / "metrics.csv")
    assert float(row["rollout_forwards"]) == 4 + 1  # ceil(0.6 * 6) SDE steps, then one Euler step for the other 2
    config = (run / "config.yaml").read_text()
    assert "tail_solver: euler" in config and "tail_steps: 1" in config
