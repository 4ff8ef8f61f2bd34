"""grpo.objective: the loss closures and the gradient phase that the module, benchmarks and tests share."""
import pytest
import torch

from jagg_lab.grpo import GRPOConfig, rollout_advantages
from jagg_lab.policies import guided_velocity_fn
from jagg_lab.strategies import FullStrategy, JaggStrategy
from tests.conftest import flat_grad, make_module, rollout_and_advantages


@pytest.fixture(scope="module")
def setting():
    module = make_module(guidance=3.0, beta=0.05, num_steps=4)
    rollout, advantages = rollout_and_advantages(module)
    return module, rollout, advantages


def test_the_rollout_carries_the_sampler_settings_its_loss_needs(setting):
    module, rollout, _ = setting
    assert rollout.noise_level == module.sampler.noise_level
    assert rollout.log_prob_reduction == module.sampler.log_prob_reduction
    assert rollout.s_first_below_one == pytest.approx(rollout.noise_levels[1].item())


def test_backward_reports_one_loss_record_per_trained_step_and_the_first_value_wins(setting):
    module, rollout, advantages = setting
    idx = torch.arange(rollout.states.shape[0])
    module.policy.zero_grad(set_to_none=True)
    stats, steps = module.objective.loss.backward(JaggStrategy(window=4, diagnose_every=1), module.policy, rollout,
                                             advantages, idx, params=module.trainable_parameters())
    assert len(steps) == len(module.objective.loss.trained_steps) and "grad_cosine" in stats
    # on-policy the first evaluation of every step has ratio 1
    assert all(abs(s.ratio_mean.item() - 1) < 1e-5 for s in steps)
    record = {}
    loss = module.objective.loss.step_loss_fn(rollout, idx, advantages, record=record)
    v = rollout.velocities[idx, 0]
    loss(0, v)
    loss(0, v + 1.0)  # a later evaluation of the same step does not replace the first
    assert abs(record[0].ratio_mean.item() - 1) < 1e-5
    module.policy.zero_grad(set_to_none=True)


def test_the_gradient_phase_is_the_gradient_of_the_scaled_mean_loss(setting):
    module, rollout, advantages = setting
    idx = torch.arange(rollout.states.shape[0])
    module.policy.zero_grad(set_to_none=True)
    module.objective.loss.backward(FullStrategy(), module.policy, rollout, advantages, idx, scale=0.5)
    half = flat_grad(module)
    module.policy.zero_grad(set_to_none=True)
    module.objective.loss.backward(FullStrategy(), module.policy, rollout, advantages, idx, scale=1.0)
    assert torch.allclose(flat_grad(module), 2 * half, rtol=1e-5, atol=1e-8)
    module.policy.zero_grad(set_to_none=True)


def test_the_velocity_closure_takes_whole_stacked_copies_only(setting):
    module, rollout, _ = setting
    call = guided_velocity_fn(module.policy, rollout.cond, rollout.null_cond, 3.0)
    rows = rollout.states.shape[0]
    x, s = rollout.states[:, 0], torch.full((rows,), 0.9)
    with torch.no_grad():
        single, double = call(x, s), call(torch.cat([x, x]), torch.cat([s, s]))
        assert torch.allclose(double[:rows], single, atol=1e-5) and torch.allclose(double[rows:], single, atol=1e-5)
        with pytest.raises(ValueError, match="whole copies"):
            call(x[:-1], s[:-1])


def test_shuffled_advantages_need_their_generator():
    rewards, group_ids = torch.arange(8.0), torch.arange(2).repeat_interleave(4)
    with pytest.raises(ValueError, match="generator"):
        rollout_advantages(rewards, group_ids, GRPOConfig(shuffle_advantages=True))
    a = rollout_advantages(rewards, group_ids, GRPOConfig(shuffle_advantages=True), torch.Generator().manual_seed(0))
    b = rollout_advantages(rewards, group_ids, GRPOConfig(shuffle_advantages=True), torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
