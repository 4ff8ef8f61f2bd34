"""Bad inputs get clear errors naming the culprit and leave earlier outputs intact."""
import torch

from jagg_lab.checkpointing import AtomicCheckpointIO
from jagg_lab.rewards import Reward
from jagg_lab.train import ConfigError, build
from tests.test_train_cli import TINY, read_rows, train

import pytest


class WrongShapeReward(Reward):
    name = "wrong_shape"

    def components(self, images, prompts, metadata):
        return {"reward": torch.zeros(len(prompts), 2)}


class NaNReward(Reward):
    name = "nan_reward"

    def components(self, images, prompts, metadata):
        scores = torch.rand(len(prompts))
        scores[0] = float("nan")
        return {"reward": scores}


def test_reward_with_wrong_shape_is_named(tmp_path):
    proc = train(f"reward._target_={__name__}.WrongShapeReward", "~reward.dense", f"hydra.run.dir={tmp_path / 'r'}", *TINY, check=False)
    assert proc.returncode != 0 and "reward 'wrong_shape' returned shape (8, 2), expected (8,)" in proc.stderr


def test_non_finite_rewards_skip_steps_then_stop_the_run(tmp_path):
    run = tmp_path / "r"
    proc = train(f"reward._target_={__name__}.NaNReward", "~reward.dense", "max_bad_steps=2", "trainer.max_steps=5",
                 f"hydra.run.dir={run}", *TINY, check=False)
    assert proc.returncode != 0 and "2 optimizer steps in a row had a non-finite reward" in proc.stderr
    rows = read_rows(run / "metrics.csv")
    assert [int(float(r["skipped_steps"])) for r in rows] == [1, 2]


def test_prompt_file_with_unknown_word_and_bad_encoding(hydra_cfg, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na purple hexagon\n")
    cfg = hydra_cfg(["data.source=file", f"data.prompt_file={prompts}", "policy=dit_xs"])
    with pytest.raises(ConfigError, match="hexagon"):
        build(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    prompts.write_bytes(b"a red \xff\xfe circle\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        build(cfg, tmp_path / "run")


def test_missing_policy_checkpoint_is_named(hydra_cfg, tmp_path):
    cfg = hydra_cfg(["policy=dit_xs", "policy.checkpoint=/nonexistent/base.safetensors"])
    with pytest.raises(ConfigError, match="/nonexistent/base.safetensors"):
        build(cfg, tmp_path / "run")


def test_checkpoint_writes_are_atomic(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"a": torch.ones(3)}, path)
    with pytest.raises(Exception):
        io.save_checkpoint({"a": lambda: None}, path)  # unpicklable: the write fails midway
    assert torch.equal(torch.load(path)["a"], torch.ones(3))  # the earlier checkpoint survives
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # and no temporary is left


def test_output_dir_that_cannot_be_created_is_named(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    proc = train(f"hydra.run.dir={blocker / 'run'}", *TINY, check=False)
    assert proc.returncode != 0 and str(blocker / "run") in proc.stderr
    assert blocker.read_text() == "not a directory"
