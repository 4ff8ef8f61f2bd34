import math

import pytest
import torch

from jagg_lab.sampling import gaussian_log_prob, noise_schedule, sde_std, sde_step, shift_noise_levels
from tests.conftest import make_module, rollout_and_advantages


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sde_log_prob_matches_torch_normal(reduction):
    torch.manual_seed(0)
    x, v = torch.randn(5, 3, 8, 8), torch.randn(5, 3, 8, 8)
    step = sde_step(x, v, 0.6, 0.5, noise_level=0.7, s_first_below_one=0.9, noise=torch.randn_like(x), reduction=reduction)
    normal = torch.distributions.Normal(step.mean, step.std)
    expected = normal.log_prob(step.sample).flatten(1)
    expected = expected.mean(1) if reduction == "mean" else expected.sum(1)
    torch.testing.assert_close(step.log_prob, expected, rtol=1e-5, atol=1e-5)


def test_sde_step_scores_a_given_sample_like_it_drew_it():
    torch.manual_seed(1)
    x, v = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    drawn = sde_step(x, v, 1.0, 0.8, noise_level=0.7, s_first_below_one=0.8, noise=torch.randn_like(x))
    scored = sde_step(x, v, 1.0, 0.8, noise_level=0.7, s_first_below_one=0.8, sample=drawn.sample)
    torch.testing.assert_close(scored.log_prob, drawn.log_prob)


def test_sde_std_uses_first_level_below_one_at_s_equal_one():
    std_k, std = sde_std(1.0, 0.9, 0.7, 0.9)
    assert std_k == pytest.approx(0.7 * math.sqrt(1.0 / 0.1))
    assert std == pytest.approx(std_k * math.sqrt(0.1))


def test_gaussian_log_prob_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="log_prob_reduction"):
        gaussian_log_prob(torch.zeros(1, 2), torch.zeros(1, 2), 1.0, reduction="max")


def test_noise_schedule_endpoints_and_shift():
    s = noise_schedule(10, shift=3.0)
    assert s.shape == (11,) and s[0] == 1.0 and s[-1] == 0.0
    assert torch.all(s[:-1] > s[1:])
    torch.testing.assert_close(s, shift_noise_levels(torch.linspace(1, 0, 11), 3.0))
    # shift > 1 spends more steps at high noise
    assert s[5] > 0.5


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_on_policy_ratio_is_one_at_training_batch_sizes(guidance):
    """Re-scoring the rollout with the sampling parameters, in micro-batches as training does,
    reproduces the stored log-probs: ratio == 1 within 1e-5."""
    module = make_module(guidance=guidance, micro_batch_size=4)
    rollout, advantages = rollout_and_advantages(module)
    levels = rollout.noise_levels.tolist()
    for idx in torch.arange(rollout.states.shape[0]).split(4):
        velocity_fn = module.objective.loss.velocity_fn(module.policy, rollout, idx)
        for k in range(rollout.num_steps):
            x = rollout.states[idx, k]
            with torch.no_grad():
                v = velocity_fn(x, torch.full((len(idx),), levels[k]))
            step = sde_step(x, v, levels[k], levels[k + 1], noise_level=0.7, s_first_below_one=levels[1], sample=rollout.next_states[idx, k])
            ratio = (step.log_prob - rollout.log_probs[idx, k]).exp()
            assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5), (k, ratio)


def test_reference_means_are_computed_at_the_trained_steps_only():
    """With KL on, the reference policy runs only where GRPO trains (its means are NaN at the
    other steps), and there its means equal those of a rollout that evaluates it everywhere."""
    module = make_module(beta=0.04, train_fraction=0.5, guidance=3.0)
    assert module.objective.trained_steps == [0, 1, 2, 3]
    calls = []
    hook = module.objective.ref_policy.register_forward_hook(lambda *_: calls.append(1))
    rollout, _ = rollout_and_advantages(module)
    hook.remove()
    assert len(calls) == len(module.objective.trained_steps)  # one batched (CFG) reference call per trained step
    trained, other = rollout.ref_means[:, :4], rollout.ref_means[:, 4:]
    assert torch.isfinite(trained).all() and torch.isnan(other).all()
    module.objective.trained_steps = list(range(8))
    everywhere, _ = rollout_and_advantages(module)
    assert torch.equal(everywhere.final, rollout.final)
    assert torch.allclose(everywhere.ref_means[:, :4], trained)
