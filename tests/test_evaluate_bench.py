"""The evaluation, benchmark and pretraining entry points on tiny settings."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jagg_lab import bench, evaluate

REPO = Path(__file__).resolve().parent.parent


def test_evaluate_ground_truth_is_near_perfect(tmp_path):
    out = tmp_path / "gt.json"
    assert evaluate.main(["source=ground_truth", "n_samples=60", "seed=3", f"out={out}"]) == 0
    result = json.loads(out.read_text())
    assert result["strict_accuracy"] >= 0.99 and len(result["per_category"]) == 6
    per_sample = result["per_sample"]  # in prompt order, for paired comparisons of two policies
    assert len(per_sample["strict"]) == len(per_sample["dense"]) == 60
    assert sum(per_sample["strict"]) / 60 == pytest.approx(result["strict_accuracy"])
    assert sum(per_sample["dense"]) / 60 == pytest.approx(result["dense_score"])


def test_evaluate_policy_writes_scores_per_category(tmp_path):
    out = tmp_path / "pol.json"
    assert evaluate.main(["source=policy", "checkpoint=null", "size=XS", "n_samples=12", "num_steps=2", f"out={out}"]) == 0
    result = json.loads(out.read_text())
    assert 0.0 <= result["strict_accuracy"] <= 1.0 and set(result["per_category"]) <= {
        "single_object", "two_objects", "counting", "colors", "position", "color_attr"}


def test_evaluate_samples_with_the_sde_when_given_a_noise_level():
    """noise_level > 0 samples GRPO's SDE: reproducible in seed, different from the ODE,
    and at noise_level 0 exactly the ODE."""
    from jagg_lab.policies import DiTPolicy

    policy = DiTPolicy(size="XS", resolution=16, checkpoint=None).eval()
    prompts = ["a red circle", "two squares", "a blue triangle"]
    sample = lambda **kw: evaluate.sample_images(policy, prompts, seed=3, num_steps=4, **kw)  # noqa: E731
    ode, sde = sample(), sample(noise_level=0.7)
    assert torch.equal(sde, sample(noise_level=0.7))
    assert torch.equal(ode, sample(noise_level=0.0))
    assert (sde - ode).abs().max() > 1e-3


def test_evaluate_rejects_unknown_keys_and_sources(capsys):
    assert evaluate.main(["bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert evaluate.main(["source=nope"]) == 2
    assert "source" in capsys.readouterr().err
    assert evaluate.main(["noise_level=-0.1"]) == 2
    assert "noise_level" in capsys.readouterr().err


def test_bench_strategies_reports_every_configuration(tmp_path):
    out = tmp_path / "bench.json"
    code = bench.main(["strategies", "checkpoint=null", "size=XS", "prompts=2", "group_size=2", "num_steps=8",
                       "windows=[2,4]", "modes=[cached]", "knot_spacings=[3]", "knot_budgets=[3]", "repeats=1", f"out={out}"])
    assert code == 0
    rows = json.loads(out.read_text())["results"]
    keyed = {(r["strategy"], r["window"], r["mode"]): r for r in rows}
    assert set(keyed) == {("full", 1, "-"), ("subsample", 2, "-"), ("subsample", 4, "-"), ("jagg", 2, "cached"), ("jagg", 4, "cached"),
                          ("jagg_knots", 3, "cached"), ("jagg_knots_adaptive", 3, "cached"), ("jagg_knots_even", 3, "cached")}
    assert keyed[("jagg_knots", 3, "cached")]["backward_items"] == 4  # knots 0, 3, 6, 7
    assert keyed[("jagg", 2, "cached")]["grad_cosine"] > 0.9999
    assert keyed[("jagg", 4, "cached")]["backward_passes"] == 2 and keyed[("full", 1, "-")]["backward_passes"] == 8


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


@pytest.mark.slow
def test_bench_strategies_runs_sd3_random_policy(tmp_path):
    out = tmp_path / "sd3.json"
    code = bench.main(["strategies", "policy=sd3_random", "dtype=float32", "num_layers=1", "resolution=64", "prompts=1",
                       "group_size=2", "num_steps=4", "windows=[2]", "modes=[cached]", "knot_spacings=[]", "knot_budgets=[]",
                       "repeats=1", f"out={out}"])
    assert code == 0
    rows = {(r["strategy"], r["window"]): r for r in json.loads(out.read_text())["results"]}
    assert rows[("jagg", 2)]["grad_cosine"] > 0.9999
