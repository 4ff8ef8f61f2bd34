import torch

from jagg_lab.grpo import GRPOLoss
from jagg_lab.sampling import sde_step


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
