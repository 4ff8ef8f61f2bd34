"""The benchmarks' gradient phase is the training step's: the same gradient and stats."""
import pytest
import torch

from jagg_lab.bench import common
from jagg_lab.rewards.base import Reward
from jagg_lab.strategies import JaggKnotsStrategy, JaggStrategy, SubsampleStrategy
from tests.conftest import flat_grad, make_module, rollout_and_advantages, strategy_gradient


@pytest.mark.parametrize("strategy", [JaggStrategy(window=4, mode="cached"), SubsampleStrategy(window=2, choice="fixed"),
                                      JaggKnotsStrategy(knot_spacing=3)], ids=["jagg", "subsample", "knots"])
def test_gradient_phase_matches_the_training_steps_backward(strategy):
    module = make_module()
    rollout, advantages = rollout_and_advantages(module)
    seconds, stats = common.gradient_phase(module, strategy, rollout, advantages, "cpu")
    grad = flat_grad(module)
    expected, expected_stats = strategy_gradient(module, strategy, rollout, advantages)
    assert seconds > 0 and stats == expected_stats
    assert grad.norm() > 0 and torch.allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_advantages_are_centred_within_each_prompts_group():
    module = make_module()
    prompts = common.grouped_prompts(2, module.group_size, seed=0)
    assert len(prompts) == 2 * module.group_size and prompts[0] == prompts[module.group_size - 1]
    rollout = module.make_rollout(prompts, torch.Generator().manual_seed(0))
    adv = common.advantages(module, rollout, prompts, seed=0)
    assert adv.shape == (len(prompts),) and adv.abs().max() > 0.1
    assert torch.allclose(adv.view(2, module.group_size).sum(dim=1), torch.zeros(2), atol=1e-4)


class ConstantReward(Reward):
    name = "constant"

    def components(self, images, prompts, metadata):
        return {"reward": torch.ones(len(prompts))}


def test_a_constant_reward_gives_seeded_random_advantages():
    """No signal to compare gradients on otherwise: every gradient would be zero."""
    module = make_module()
    module.reward = ConstantReward()
    prompts = common.grouped_prompts(2, module.group_size, seed=0)
    rollout = module.make_rollout(prompts, torch.Generator().manual_seed(0))
    adv = common.advantages(module, rollout, prompts, seed=3)
    assert torch.equal(adv, torch.randn(len(prompts), generator=torch.Generator().manual_seed(3)))


def test_machine_names_the_device_and_software():
    info = common.machine("cpu")
    assert info["device"] == "cpu" and info["cuda"] is None and info["torch"] == torch.__version__
    assert info["cpu_count"] >= 1 and info["torch_threads"] >= 1
