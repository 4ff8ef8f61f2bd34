"""Every numeric key of every config group, given a bad value, is refused before any work
with an error naming the key, and leaves no run directory behind."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from jagg_lab.train import ConfigError, build
from tests.conftest import CONF_DIR
from tests.test_configs import NEEDS_WEIGHTS

GROUPS = ["policy", "sampler", "reward", "strategy", "data", "grpo", "objective", "optimizer", "trainer", "logger"]
# Options that cannot be built on this machine (GPU trainers) or are GPU-sized (sd3_random).
SKIP = {("trainer", "ddp"), ("trainer", "fsdp"), ("policy", "sd3_random")} | NEEDS_WEIGHTS
# Keys for which -1 is a legal value: another bad value instead.
BAD_VALUE = {"max_epochs": -2, "num_sanity_val_steps": -2, "cos_threshold": 2, "max_steps": 0}
TOP_LEVEL = ["seed", "sample_every", "checkpoint_every", "checkpoint_every_minutes", "max_bad_steps"]
BLOCKS = ["heldout", "progress"]  # single-option blocks of train.yaml


def _numeric_keys(node) -> list[str]:
    return [k for k, v in node.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _cases(compose) -> list[tuple[list[str], str]]:
    cases = []
    for group in GROUPS:
        for option in sorted(p.stem for p in Path(CONF_DIR, group).glob("*.yaml")):
            if (group, option) in SKIP:
                continue
            node = compose([f"{group}={option}"])[group]
            node = OmegaConf.to_container(node, resolve=False) if node is not None else {}
            cases += [([f"{group}={option}", f"{group}.{k}={BAD_VALUE.get(k, -1)}"], f"{group}.{k}")
                      for k in _numeric_keys(node)]
    cfg = compose([])
    for block in BLOCKS:
        cases += [([f"{block}.{k}={BAD_VALUE.get(k, -1)}"], f"{block}.{k}") for k in _numeric_keys(cfg[block])]
    cases += [([f"{k}={BAD_VALUE.get(k, -1)}"], k) for k in TOP_LEVEL]
    return cases


def test_every_numeric_key_with_a_bad_value_is_refused_naming_it(hydra_cfg, tmp_path):
    cases = _cases(hydra_cfg)
    assert len(cases) > 60  # the walk reaches every group
    accepted, unnamed = [], []
    for i, (overrides, key) in enumerate(cases):
        run_dir = tmp_path / f"run{i}"
        try:
            build(hydra_cfg(["policy=dit_xs", *overrides]), run_dir)
            accepted.append(key)
        except (ConfigError, FileNotFoundError) as err:
            if key.rsplit(".", 1)[-1] not in str(err):
                unnamed.append(f"{key}: {err}")
        assert not run_dir.exists(), key
    assert not accepted, f"bad values accepted: {accepted}"
    assert not unnamed, "errors that do not name the key:\n" + "\n".join(unnamed)


@pytest.mark.parametrize("overrides,key", [
    (["optimizer.lr=-1"], "optimizer.lr"),
    (["reward=clip"], "reward.pretrained"),
    (["trainer.max_steps=0"], "trainer.max_steps"),
    (["trainer.max_steps=-1"], "trainer.max_time"),
])
def test_reported_bad_inputs_are_refused_before_any_work(hydra_cfg, tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(hydra_cfg(["policy=dit_xs", *overrides]), tmp_path / "run")
    assert not (tmp_path / "run").exists()
