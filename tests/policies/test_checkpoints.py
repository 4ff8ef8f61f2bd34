"""A policy loads from a training checkpoint (.ckpt) as well as from its own safetensors file."""
import pytest
import torch

from jagg_lab.policies import DiTPolicy
from tests.conftest import randomized_policy


def module_checkpoint(policy, path):
    state = {f"policy.{k}": v for k, v in policy.state_dict().items()}
    state["ref_policy.w"] = torch.zeros(1)  # other module state is ignored
    torch.save({"state_dict": state, "rollouts_done": 3}, path)


def test_policy_loads_its_weights_from_a_training_checkpoint(tmp_path):
    trained = randomized_policy(seed=3)
    module_checkpoint(trained, tmp_path / "last.ckpt")
    loaded = DiTPolicy(size="XS", checkpoint=str(tmp_path / "last.ckpt"))
    for (name, a), b in zip(trained.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_of_another_size_is_named_in_the_error(tmp_path):
    module_checkpoint(randomized_policy(seed=3), tmp_path / "xs.ckpt")
    with pytest.raises(ValueError, match="xs.ckpt does not match the policy"):
        DiTPolicy(size="S", checkpoint=str(tmp_path / "xs.ckpt"))
