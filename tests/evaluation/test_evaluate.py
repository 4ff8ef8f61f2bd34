"""`python -m jagg_lab.evaluate` on tiny settings: scores, argument errors, --help, and any
policy through a training run's directory."""
import json
import subprocess
import sys

import pytest
import torch
import torchvision
from hydra.utils import instantiate
from omegaconf import OmegaConf

from jagg_lab import evaluate
from jagg_lab.evaluation import eval_prompts, paired_gain, sample_images
from tests.conftest import randomized_policy
from tests.evaluation.conftest import WRAPPED_TARGET, WrappedDiT, write_run
from tests.test_train_cli import REPO


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


def test_evaluate_categories_picks_the_prompts_of_those_categories(tmp_path, capsys):
    out = tmp_path / "counting.json"
    assert evaluate.main(["source=ground_truth", "n_samples=8", "seed=3", "categories=[counting,colors]", f"out={out}"]) == 0
    result = json.loads(out.read_text())
    assert set(result["per_category"]) == {"counting", "colors"} and result["per_category"]["counting"]["n"] == 4
    assert eval_prompts(8, 3, categories=["counting", "colors"]) == eval_prompts(8, 3, categories=["counting", "colors"])
    assert evaluate.main(["categories=[shading]"]) == 2
    assert "categories" in capsys.readouterr().err


def test_evaluate_rejects_unknown_keys_and_sources(capsys):
    assert evaluate.main(["bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert evaluate.main(["source=nope"]) == 2
    assert "source" in capsys.readouterr().err
    assert evaluate.main(["noise_level=-0.1"]) == 2
    assert "noise_level" in capsys.readouterr().err


def test_evaluate_help_lists_every_argument_and_exits_0(capsys):
    assert evaluate.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m jagg_lab.evaluate")
    for line in ("n_samples: int = 128", "checkpoint: str | None = 'shipped'", "run: str | None = None"):
        assert line in out
    assert "0: the ODE; > 0: the SDE" in out  # the field's comment
    assert "DIR/config.yaml's `policy` node" in out  # the docstring
    # as a user runs it: before, this failed with "Key '--help' not in 'EvalArgs'"
    proc = subprocess.run([sys.executable, "-m", "jagg_lab.evaluate", "-h"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "noise_level: float = 0.0" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("wrapped", [False, True], ids=["dit", "any_policy"])
def test_evaluate_scores_the_policy_of_a_run_directory(tmp_path, wrapped):
    """run=DIR builds the run's policy from its config and loads its trained weights: the same
    samples as the DiT's checkpoint= path with those weights, unlike a fresh init; a policy
    class without `load` goes through the same path."""
    trained = randomized_policy(size="XS", resolution=16, seed=3).eval()
    if wrapped:
        policy, node = WrappedDiT(), {"_target_": WRAPPED_TARGET, "size": "XS", "resolution": 16}
        policy.inner.load_state_dict(trained.state_dict())
    else:
        policy, node = trained, {"_target_": "jagg_lab.policies.DiTPolicy", "size": "XS", "resolution": 16, "checkpoint": None}
    run = write_run(tmp_path / "run", policy, node)
    trained.save(tmp_path / "weights.safetensors")
    common = ["n_samples=6", "num_steps=2", "batch_size=4"]
    sources = {"run": [f"run={run}"], "checkpoint": ["size=XS", "resolution=16", f"checkpoint={tmp_path / 'weights.safetensors'}"],
               "fresh": ["size=XS", "resolution=16", "checkpoint=null"]}
    for name, source in sources.items():
        assert evaluate.main([*source, *common, f"out={tmp_path / name}.json", f"grid={tmp_path / name}.png"]) == 0
    grids = {name: (tmp_path / f"{name}.png").read_bytes() for name in sources}
    assert grids["run"] == grids["checkpoint"] != grids["fresh"]
    result, reference = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("run", "checkpoint"))
    assert result["args"]["run"] == str(run) and result["args"]["checkpoint"] == str(run / "policy.safetensors")
    assert (result["args"]["size"], result["args"]["resolution"]) == ("XS", 16)
    gain = paired_gain(result, reference)  # same prompts and noise: pairable, and no difference
    assert gain["strict_gain"] == gain["dense_gain"] == gain["dense_gain_se"] == 0


def test_evaluate_run_errors_name_the_missing_file(tmp_path, capsys):
    assert evaluate.main([f"run={tmp_path}", "n_samples=2"]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    run = write_run(tmp_path / "run", WrappedDiT(), {"_target_": WRAPPED_TARGET})
    (run / "policy.safetensors").unlink()
    assert evaluate.main([f"run={run}", "n_samples=2"]) == 2
    assert "policy.safetensors" in capsys.readouterr().err


SD3_TINY = ["policy=sd3_random", "policy.num_layers=1", "policy.resolution=64", "policy.text_length=8",
            "policy.pos_embed_max_size=8", "policy.dtype=float32"]


def test_evaluate_scores_a_diffusers_run(tmp_path, hydra_cfg):
    """An SD3-style LoRA policy (SD3.5-M's transformer, one random layer, no VAE) through run=:
    the base is rebuilt from the config, the trained adapters loaded, and the samples are the
    trained policy's own."""
    node = OmegaConf.to_container(hydra_cfg(SD3_TINY).policy)
    trained = instantiate(node)
    with torch.no_grad():  # trained adapters: LoRA's zero-initialised B moved, so they change the samples
        for p in trained.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    run = write_run(tmp_path / "run", trained, node)
    out, grid = tmp_path / "sd3.json", tmp_path / "sd3.png"
    assert evaluate.main([f"run={run}", "n_samples=3", "num_steps=2", f"out={out}", f"grid={grid}"]) == 0
    result = json.loads(out.read_text())
    assert (result["args"]["size"], result["args"]["resolution"]) == (None, 64) and len(result["per_sample"]["dense"]) == 3
    expected = sample_images(trained.eval(), eval_prompts(3, seed=1), seed=1, num_steps=2)
    torchvision.utils.save_image(expected, tmp_path / "expected.png", nrow=8)
    assert grid.read_bytes() == (tmp_path / "expected.png").read_bytes()
