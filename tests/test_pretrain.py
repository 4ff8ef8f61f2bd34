"""The pretraining entry point on tiny settings, and its learning-rate schedule: linear warmup,
constant, linear decay to 0."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jagg_lab.pretrain import PretrainModule, lr_factor

REPO = Path(__file__).resolve().parent.parent


def test_warmup_stable_decay() -> None:
    f = [lr_factor(i, warmup_steps=10, decay_steps=20, max_steps=100) for i in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == 1.0  # warmup
    assert f[10:80] == [1.0] * 70  # stable
    assert f[90] == pytest.approx(0.5) and f[99] == pytest.approx(0.05)  # decay towards 0 at max_steps
    assert all(a >= b for a, b in zip(f[9:], f[10:]))


def test_no_decay_keeps_the_rate_constant() -> None:
    assert lr_factor(10**6, warmup_steps=10, decay_steps=0, max_steps=100) == 1.0


def test_negative_decay_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="decay_steps"):
        PretrainModule(policy=None, decay_steps=-1)


def test_pretrain_runs_resumes_and_exports_a_loadable_policy(tmp_path):
    run, resumed = tmp_path / "pt", tmp_path / "pt2"
    common = [sys.executable, "-m", "jagg_lab.pretrain", "policy.size=XS", "batch_size=8", "module.eval_every=0",
              "checkpoint_every=2"]
    proc = subprocess.run([*common, "max_steps=2", f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run / "policy.safetensors").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert "will be deleted" not in proc.stdout + proc.stderr
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    resume = f"resume={run / 'checkpoints' / 'last.ckpt'}"
    # resuming into the run's own directory would replace its metrics and checkpoints: refused, nothing touched
    proc = subprocess.run([*common, "max_steps=4", resume, f"hydra.run.dir={run}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0 and "already holds a run" in proc.stderr and "hydra.run.dir" in proc.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    proc = subprocess.run([*common, "max_steps=4", resume, f"hydra.run.dir={resumed}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 4
    assert (resumed / "policy.safetensors").is_file()
    from jagg_lab.policies import DiTPolicy

    DiTPolicy(size="XS", checkpoint=str(resumed / "policy.safetensors"))
    with pytest.raises(ValueError, match="does not match"):
        DiTPolicy(size="S", checkpoint=str(resumed / "policy.safetensors"))
