import math

import pytest
import torch

from jagg_lab.grpo import GRPOLoss
from jagg_lab.sampling import PipelineSchedule, kl_penalty, sde_step, transition_kl


def _setup(seed=0):
    torch.manual_seed(seed)
    x, v = torch.randn(6, 3, 4, 4), torch.randn(6, 3, 4, 4)
    step = sde_step(x, v, 0.7, 0.6, noise_level=0.7, s_first_below_one=0.9, noise=torch.randn_like(x))
    return x, v, step


def test_on_policy_loss_is_minus_mean_advantage_and_gradient_is_the_policy_gradient():
    x, v, step = _setup()
    adv = torch.randn(6)
    loss_fn = GRPOLoss(clip_range=0.2)
    v_leaf = v.clone().requires_grad_(True)
    loss, stats = loss_fn(v_leaf, x, step.sample, 0.7, 0.6, step.log_prob, adv, noise_level=0.7, s_first_below_one=0.9)
    assert torch.isclose(loss, -adv.mean(), atol=1e-6)
    assert stats.clip_frac == 0 and abs(stats.ratio_mean - 1) < 1e-6
    # at ratio 1 the clipped objective's gradient is -mean(A * grad log pi)
    (g,) = torch.autograd.grad(loss, v_leaf)
    v2 = v.clone().requires_grad_(True)
    logp = sde_step(x, v2, 0.7, 0.6, noise_level=0.7, s_first_below_one=0.9, sample=step.sample).log_prob
    (g_ref,) = torch.autograd.grad(-(adv * logp).mean(), v2)
    torch.testing.assert_close(g, g_ref)


def test_clipping_zeroes_the_gradient_outside_the_trust_region():
    x, v, step = _setup(1)
    v_far = v + 0.5  # moves every ratio far from 1
    logp = sde_step(x, v_far, 0.7, 0.6, noise_level=0.7, s_first_below_one=0.9, sample=step.sample).log_prob
    # Advantages that push each ratio further out: every term is clipped, so no gradient.
    adv = torch.sign(logp - step.log_prob)
    v_leaf = v_far.clone().requires_grad_(True)
    loss, stats = GRPOLoss(clip_range=1e-4)(v_leaf, x, step.sample, 0.7, 0.6, step.log_prob, adv, noise_level=0.7, s_first_below_one=0.9)
    assert stats.clip_frac == 1.0
    (g,) = torch.autograd.grad(loss, v_leaf)
    assert g.abs().max() == 0
    # The opposite advantages are not clipped (the objective pulls the ratio back).
    v_leaf2 = v_far.clone().requires_grad_(True)
    loss2, _ = GRPOLoss(clip_range=1e-4)(v_leaf2, x, step.sample, 0.7, 0.6, step.log_prob, -adv, noise_level=0.7, s_first_below_one=0.9)
    (g2,) = torch.autograd.grad(loss2, v_leaf2)
    assert g2.abs().max() > 0


def test_kl_is_zero_at_reference_and_positive_away_from_it():
    x, v, step = _setup(2)
    adv = torch.zeros(6)
    loss_fn = GRPOLoss(clip_range=0.2, beta=1.0)
    loss, stats = loss_fn(v, x, step.sample, 0.7, 0.6, step.log_prob, adv, noise_level=0.7, s_first_below_one=0.9, ref_mean=step.mean)
    assert stats.kl < 1e-10
    _, stats2 = loss_fn(v + 0.1, x, step.sample, 0.7, 0.6, step.log_prob, adv, noise_level=0.7, s_first_below_one=0.9, ref_mean=step.mean)
    assert stats2.kl > 1e-6


@pytest.mark.parametrize("k", [0, 4, 8, 9])
def test_kl_term_is_flow_grpos_closed_form_on_the_sd35m_grid(k):
    """beta * KL with KL = mean over dims of (mu - mu_ref)^2 / (2 std_k^2), std_k = a sqrt(s / (1 - s)):
    Flow-GRPO's kl_loss, so its betas transfer. The exact transition KL (over the variance
    std_k^2 (-dt), the scale before) is 1 / (-dt) times larger: 3.7x to 112x on this grid."""
    levels = PipelineSchedule("sd3", image_seq_len=1024, shift=3.0).noise_levels(10).tolist()
    s, s_next, a = levels[k], levels[k + 1], 0.7
    torch.manual_seed(3)
    x, v, ref_v = torch.randn(4, 3, 4, 4), torch.randn(4, 3, 4, 4), torch.randn(4, 3, 4, 4)
    step = sde_step(x, v, s, s_next, noise_level=a, s_first_below_one=levels[1], noise=torch.randn_like(x))
    std_k = a * math.sqrt(s / (1 - (levels[1] if s == 1.0 else s)))
    dt = s_next - s
    mean_of = lambda vel: x + (vel + std_k**2 / (2 * s) * (x + (1 - s) * vel)) * dt  # noqa: E731
    closed = ((mean_of(v) - mean_of(ref_v)) ** 2).mean(dim=(1, 2, 3)) / (2 * std_k**2)  # (B,)
    beta = 0.04
    loss, stats = GRPOLoss(clip_range=1e-4, beta=beta)(v, x, step.sample, s, s_next, step.log_prob, torch.zeros(4),
                                                       noise_level=a, s_first_below_one=levels[1], ref_mean=mean_of(ref_v))
    torch.testing.assert_close(stats.kl, closed.mean())
    torch.testing.assert_close(loss, beta * closed.mean())  # zero advantages: the loss is the KL term alone
    exact = transition_kl(mean_of(v), mean_of(ref_v), std_k * math.sqrt(-dt))
    torch.testing.assert_close(exact * -dt, closed)
    assert 1 / -dt > 3.5  # control: the exact-KL scale (the loss's before) misses the closed form by 3.7x or more
    torch.testing.assert_close(kl_penalty(mean_of(v), mean_of(ref_v), std_k), closed)


def test_an_on_policy_ratio_is_taken_against_its_own_forward_so_rounding_cannot_clip():
    x, v, step = _setup(2)
    adv = torch.randn(6)
    # the rollout's forward rounded differently from the gradient phase's (another precision or batch)
    stale = sde_step(x, v + 1e-2, 0.7, 0.6, noise_level=0.7, s_first_below_one=0.9, sample=step.sample).log_prob
    loss_fn = GRPOLoss(clip_range=1e-4)
    v_leaf = v.clone().requires_grad_(True)
    loss, stats = loss_fn(v_leaf, x, step.sample, 0.7, 0.6, None, adv, noise_level=0.7, s_first_below_one=0.9)
    assert stats.ratio_mean == 1 and stats.clip_frac == 0 and stats.approx_kl == 0
    (g,) = torch.autograd.grad(loss, v_leaf)
    # the gradient at ratio 1: -mean(A * grad log pi), as against the exact old log-prob
    v_ref = v.clone().requires_grad_(True)
    exact, _ = loss_fn(v_ref, x, step.sample, 0.7, 0.6, step.log_prob, adv, noise_level=0.7, s_first_below_one=0.9)
    (g_ref,) = torch.autograd.grad(exact, v_ref)
    torch.testing.assert_close(g, g_ref)
    # against the stale log-prob the same step would clip on rounding alone
    _, stale_stats = loss_fn(v.clone().requires_grad_(True), x, step.sample, 0.7, 0.6, stale, adv, noise_level=0.7,
                             s_first_below_one=0.9)
    assert stale_stats.clip_frac > 0
