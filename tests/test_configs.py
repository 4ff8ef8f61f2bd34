"""Every config group instantiates, and bad values fail before any work, naming the key."""
import re
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from jagg_lab.checks import check_types
from jagg_lab.train import ConfigError, build
from tests.conftest import CONF_DIR

GROUPS = ["policy", "sampler", "reward", "strategy", "data", "grpo", "objective", "optimizer", "trainer"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted(Path(CONF_DIR, g).glob("*.yaml"))]
EXPERIMENTS = sorted(p.stem for p in Path(CONF_DIR, "experiment").glob("*.yaml"))


# Options that load user-supplied local weights: without them they must stop, naming the key.
NEEDS_WEIGHTS = {("policy", "sd3"), ("policy", "flux"), ("reward", "clip"), ("reward", "pickscore")}
# Options whose full size is GPU-sized: built at a CPU size here.
SHRINK = {("policy", "sd3_random"): ["policy.num_layers=1", "policy.resolution=64", "policy.pos_embed_max_size=8",
                                     "policy.text_length=8"]}
GPU_EXPERIMENTS = {"sd35m_jagg_w4", "flux_jagg_w4"}
# Options that need a GPU: without one, Lightning must refuse them when the trainer is built.
NEEDS_GPU = {("trainer", "ddp"), ("trainer", "fsdp")}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_config_group_option_instantiates(hydra_cfg, group, option):
    cfg = hydra_cfg([f"{group}={option}", *SHRINK.get((group, option), [])])
    if (group, option) in NEEDS_WEIGHTS:
        with pytest.raises(Exception, match="pretrained"):
            instantiate(cfg[group])
        return
    if (group, option) in NEEDS_GPU and not torch.cuda.is_available():
        with pytest.raises(Exception, match="gpu"):
            instantiate(cfg[group])
        return
    obj = instantiate(cfg[group])
    assert obj is not None


@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_every_shipped_value_has_its_annotated_type(hydra_cfg, experiment):
    """The type check refuses no shipped config: every option of every group, every experiment."""
    loggers = [("logger", p.stem) for p in sorted(Path(CONF_DIR, "logger").glob("*.yaml"))]
    for group, option in [(None, None), *OPTIONS, *loggers] if experiment is None else [(None, None)]:
        cfg = hydra_cfg([*([f"{group}={option}"] if group else []), *([f"+experiment={experiment}"] if experiment else [])])
        for key in [*GROUPS, "logger", "heldout", "progress"]:
            check_types(cfg[key], key)


def test_gpu_experiment_composes_with_its_settings(hydra_cfg):
    cfg = hydra_cfg(["+experiment=sd35m_jagg_w4"])
    assert cfg.policy.kind == "sd3" and cfg.policy.lora_rank == 32 and cfg.policy.resolution == 512
    assert cfg.sampler.num_steps == 10 and cfg.sampler.guidance == 4.5 and cfg.sampler.noise_level == 0.7
    assert cfg.data.group_size == 24 and cfg.grpo.beta == 0.04 and cfg.strategy.window == 4
    assert cfg.trainer.accelerator == "gpu" and cfg.sampler.schedule == "pipeline" and cfg.sampler.shift == 1.0
    flux = hydra_cfg(["+experiment=flux_jagg_w4"])
    assert flux.policy.kind == "flux" and flux.policy.guidance_embed == 3.5 and flux.sampler.guidance == 1.0
    assert flux.sampler.schedule == "pipeline" and flux.sampler.num_steps == 6 and flux.grpo.beta == 0.0


@pytest.mark.parametrize("experiment", sorted(set(EXPERIMENTS) - GPU_EXPERIMENTS))
def test_every_experiment_composes_and_builds(hydra_cfg, experiment, tmp_path):
    cfg = hydra_cfg([f"+experiment={experiment}", "policy=dit_xs"])
    module, data, trainer = build(cfg, tmp_path / "run")
    assert type(module.strategy).__name__.lower().startswith(cfg.strategy._target_.rsplit(".", 1)[1].lower()[:4])
    assert (tmp_path / "run" / "config.yaml").is_file()


BAD = [
    ("data.group_size=1", "group_size"),
    ("grpo.micro_batch_size=5", "micro_batch_size"),
    ("grpo.train_fraction=0", "train_fraction"),
    ("grpo.train_fraction=1.5", "train_fraction"),
    ("policy.patch_size=5", "patch_size"),
    ("+experiment=jagg_w4 strategy.window=0", "window"),
    ("sampler.noise_level=0", "noise_level"),
    ("sampler.guidance=0.5", "guidance"),
    ("sampler.schedule=karras", "schedule"),
    ("+experiment=jagg_routed strategy.cos_threshold=null strategy.jagg_frac=2", "jagg_frac"),
    ("grpo.train_steps=[3,1]", "train_steps"),
    ("+experiment=jagg_routed strategy.cos_threshold=1.5", "cos_threshold"),
    ("grpo.beta=-1", "beta"),
    ("grpo.clip_range=0", "clip_range"),
    ("data.source=file data.prompt_file=/nonexistent/prompts.txt", "prompt_file"),
    ("sampler.tail_solver=rk4", "tail_solver"),
    ("grpo.train_fraction=1.0 sampler.tail_solver=euler", "tail_solver"),  # no tail to replace
    ("sampler.head_solver=euler", "head_solver"),  # the first step is trained
    ("+experiment=jagg_causal_w4 strategy.knot_spacing=2", "knot_spacing"),
    # A value of the wrong type, named with its key and the annotated type (any group's, any key's).
    ("sampler.num_steps=abc", "sampler.num_steps must be int, got 'abc'"),
    ("data.group_size=4.5", "data.group_size must be int"),
    ("grpo.clip_range=x", "grpo.clip_range must be float"),
    ("optimizer.lr=abc", "optimizer.lr must be float"),
    ("heldout.metric=3", "heldout.metric must be str"),
    ("+experiment=jagg_w4 strategy.window=[4]", "strategy.window must be int"),
    ("trainer.devices=1.5", "trainer.devices must be"),
    ("sampler.schedule=pipeline", "sampler.schedule=pipeline"),  # a grid the policy does not have
    # What a forward-process objective cannot use: named, with the objective.
    ("objective=nft +experiment=jagg_w4", "strategy=JaggStrategy"),
    ("objective=awm grpo.clip_range=0.2", "grpo.clip_range=0.2: not used by objective=awm"),
    ("objective=awm grpo.beta=0.04", "its KL term is objective.kl_weight"),
    ("objective=nft grpo.train_fraction=1.0", "grpo.train_fraction=1.0: not used by objective=nft"),
    ("objective=nft sampler.tail_solver=euler", "sampler.tail_solver=euler: not used by objective=nft"),
    ("objective=nft sampler.group_noise=true", "sampler.group_noise=True: not used by objective=nft"),
    ("grpo.sde_window_range=[0,4]", "set grpo.sde_window too"),
    ("objective=awm objective.weighting=cubic", "objective.weighting"),
    ("objective=nft objective.solver=rk4", "objective.solver"),
    ("objective=nft trainer=fsdp_cpu", "trainer=fsdp: objective=nft"),
    ("objective=awm grpo.block_size=5", "grpo.block_size=5: not used by objective=awm"),
    # drawn blocks (the JAGG authors' regime) and a strategy whose windows would straddle them
    ("+experiment=paper_jagg_w5 strategy.window=4", "strategy.window = 4, which does not divide it"),
    ("+experiment=paper_full strategy=jagg_knots", "links steps across blocks"),
    ("grpo.block_fraction=0.5", "set grpo.block_size too"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[b[0] for b in BAD])
def test_bad_values_fail_before_any_work_naming_the_key(hydra_cfg, tmp_path, overrides, key):
    cfg = hydra_cfg(overrides.split() + ["policy=dit_xs"])
    run_dir = tmp_path / "run"
    with pytest.raises((ConfigError, FileNotFoundError), match=re.escape(key)):
        build(cfg, run_dir)
    assert not run_dir.exists()  # nothing half-written


def test_empty_prompt_file_is_rejected(hydra_cfg, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# only a comment\n\n")
    cfg = hydra_cfg(["data.source=file", f"data.prompt_file={prompts}", "policy=dit_xs"])
    with pytest.raises(ConfigError, match="holds no prompts"):
        build(cfg, tmp_path / "run")


def test_a_run_directory_that_holds_a_run_is_never_reused(hydra_cfg, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("step\n1\n")
    with pytest.raises(ConfigError, match="already holds a run"):
        build(hydra_cfg(["policy=dit_xs"]), run_dir)
    assert (run_dir / "metrics.csv").read_text() == "step\n1\n"


@pytest.mark.parametrize("cell", sorted(p.stem for p in Path(CONF_DIR, "screen").glob("*.yaml")))
def test_every_learning_screen_cell_composes_and_builds(hydra_cfg, cell, tmp_path):
    cfg = hydra_cfg(["+experiment=screen_learning", f"+screen={cell}", "policy=dit_xs"])
    build(cfg, tmp_path / "run")
    assert cfg.trainer.max_steps == 40 and cfg.heldout.n_samples == 256


def test_the_counting_task_trains_and_grades_on_counting_prompts(hydra_cfg, tmp_path):
    cfg = hydra_cfg(["+experiment=subsample_w6", "+task=counting", "policy=dit_xs"])
    module, data, trainer = build(cfg, tmp_path / "run")
    assert {m["category"] for m in next(iter(data.train_dataloader()))["metadata"]} == {"counting"}
    heldout = next(c for c in trainer.callbacks if type(c).__name__ == "HeldoutEval")
    assert heldout.categories == ["counting"]
