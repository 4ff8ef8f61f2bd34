"""AWM and DiffusionNFT pinned against closed forms on a tiny DiT, their counts of forwards and
backward items, the soft copies of the weights, and their training-state draws."""
from __future__ import annotations

import pytest
import torch

from jagg_lab.objectives import AWM, DiffusionNFT, SoftCopy
from jagg_lab.objectives.awm import awm_log_prob, stratified_indices
from jagg_lab.objectives.forward import noised, soft_update_rate
from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.strategies.core import flat_grad
from tests.conftest import randomized_policy

PROMPTS = ["a red circle", "two squares", "a blue triangle", "three circles"]


def setup(objective, *, guidance: float = 1.0, seed: int = 0, steps: int = 6):
    """A tiny DiT, ODE samples of 4 prompts and their training states, the objective attached."""
    policy = randomized_policy(seed=seed)
    params = [p for p in policy.parameters() if p.requires_grad]
    ref = randomized_policy(seed=seed) if objective.needs_reference else None
    objective.attach(policy, params, guidance, ref)
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        cond, null = policy.encode_prompts(PROMPTS), policy.encode_prompts([""])
    noise = torch.randn((len(PROMPTS), *policy.sample_shape), generator=generator)
    levels = torch.linspace(1, 0, steps + 1)
    samples = objective.rollout(policy, params, cond, null, noise, levels, generator).for_training()
    return policy, params, samples


def gradient(policy, params, fn) -> torch.Tensor:
    policy.zero_grad(set_to_none=True)
    fn()
    return flat_grad(params)


def objective_gradient(objective, policy, params, samples, weights, on_policy=True):
    idx = torch.arange(len(PROMPTS))
    return gradient(policy, params, lambda: objective.backward(policy, params, samples, weights, idx, on_policy=on_policy))


def velocity(policy, samples, idx, x, s, guidance=1.0):
    return guided_velocity_fn(policy, {k: v[idx] for k, v in samples.cond.items()}, samples.null_cond, guidance)(x, s)


def close(a, b, rtol=1e-5):
    assert torch.allclose(a, b, rtol=rtol, atol=rtol * b.abs().max().item()), (a - b).abs().max().item()


# ---- AWM ------------------------------------------------------------------------------------
@pytest.mark.parametrize("weighting", ["uniform", "t", "ghuber"])
@pytest.mark.parametrize("guidance", [1.0, 2.5])
def test_awm_gradient_is_the_advantage_weighted_flow_matching_gradient(weighting, guidance):
    """On-policy the ratio is 1, so grad = mean_j mean_i A_i grad(-log p_ij): with the uniform
    weighting A_i times the gradient of the flow-matching error at (x_s, eps - x0), written here
    from scratch; the t and ghuber weightings multiply it by s and by s mse^(p - 1)."""
    awm = AWM(weighting=weighting, kl_weight=0.0, ema_weight=0.0, timesteps_per_sample=3, max_fraction=1.0)
    policy, params, samples = setup(awm, guidance=guidance)
    adv = torch.tensor([0.9, -0.4, 0.2, -0.7])
    got = objective_gradient(awm, policy, params, samples, adv)

    def independent():
        total = 0.0
        for j in range(3):
            s, eps, x0 = samples.levels[:, j], samples.noise[:, j], samples.final
            x = (1 - s.view(-1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1) * eps
            mse = (velocity(policy, samples, torch.arange(4), x, s, guidance) - (eps - x0)).pow(2).mean((1, 2, 3))
            per_sample = {"uniform": mse, "t": s * mse, "ghuber": s * ((mse + 1e-10) ** 0.25 - 1e-10**0.25) / 0.25}[weighting]
            total = total + (adv * per_sample).mean()
        (total / 3).backward()

    close(got, gradient(policy, params, independent))
    assert got.norm() > 0


def test_awm_regularisers_add_their_squared_velocity_gaps():
    """kl_weight ||v - v_ref||^2 and ema_weight ||v - v_ema||^2 (the soft copy, here moved off the
    policy) add exactly their gradients; with zero advantages nothing else is left."""
    awm = AWM(kl_weight=0.3, ema_weight=0.5, timesteps_per_sample=2, max_fraction=1.0)
    policy, params, samples = setup(awm)
    awm.ema.tensors = [t + 0.01 * torch.randn_like(t) for t in awm.ema.tensors]
    zero = torch.zeros(4)
    got = objective_gradient(awm, policy, params, samples, zero)
    idx = torch.arange(4)

    def independent():
        for j in range(2):
            s, x = samples.levels[:, j], noised(samples.final, samples.noise[:, j], samples.levels[:, j])
            with torch.no_grad():
                v_ref = velocity(awm.ref_policy, samples, idx, x, s)
                with awm.ema.swapped(params):
                    v_ema = velocity(policy, samples, idx, x, s)
            v = velocity(policy, samples, idx, x, s)  # a graph per state: the next swap moves the weights
            ((0.3 * (v - v_ref).pow(2).mean() + 0.5 * (v - v_ema).pow(2).mean()) / 2).backward()

    close(got, gradient(policy, params, independent))


def test_awm_off_policy_steps_clip_the_ratio_against_the_sampling_policy():
    """prepare() keeps the sampling policy's log-probs; after the weights move, a sample whose
    ratio left [1 - c, 1 + c] on the side its advantage favours gives no gradient."""
    awm = AWM(kl_weight=0.0, ema_weight=0.0, timesteps_per_sample=1, clip_range=1e-6, weighting="uniform")
    policy, params, samples = setup(awm)
    samples = awm.prepare(policy, samples, off_policy=True, micro_batch_size=3)  # micro-batches of 3 and 1
    on = objective_gradient(awm, policy, params, samples, torch.ones(4), on_policy=False)
    assert on.norm() > 0  # same weights: ratio 1, nothing clipped
    with torch.no_grad():
        for p in params:
            p.add_(1e-3 * torch.randn_like(p))
    stats, steps = awm.backward(policy, params, samples, torch.ones(4), torch.arange(4), on_policy=False)
    assert steps[0].clip_frac.item() > 0 and abs(steps[0].ratio_mean.item() - 1) > 1e-7


def test_awm_weights_are_advantages_over_their_clip():
    assert torch.equal(AWM().sample_weights(torch.tensor([-7.0, -2.5, 0.0, 5.0]), 5.0), torch.tensor([-1.0, -0.5, 0.0, 1.0]))


def test_awm_levels_are_stratified_over_the_grid_without_pure_noise():
    idx = stratified_indices(512, 10, 6, 0.9, 1, torch.Generator().manual_seed(0))
    bounds = [1, 2, 3, 5, 6, 7, 9]  # linspace(1, 9, 7) as indices: [1, 2), [2, 3), [3, 5), ...
    for k in range(6):
        assert set(idx[:, k].tolist()) == set(range(bounds[k], bounds[k + 1]))
    levels = AWM().draw_levels(64, torch.linspace(1, 0, 11), torch.Generator().manual_seed(0))
    assert levels.shape == (64, 6) and levels.max() <= 0.9 + 1e-6 and levels.min() >= 0.2 - 1e-6


# ---- DiffusionNFT ---------------------------------------------------------------------------
def nft_setup(beta=1.0, seed=0):
    nft = DiffusionNFT(beta=beta, kl_weight=0.0, time_fraction=0.5)
    policy, params, samples = setup(nft, seed=seed)
    return nft, policy, params, samples


def normalised_flow_matching(policy, samples, idx, j, use_old=None):
    """mean (x - s v - x0)^2 / stopgrad(mean |x - s v - x0|) per sample: the flow-matching error in
    x0 space with NFT's adaptive weight (x - s v - x0 = s (eps - x0 - v))."""
    s, x0 = samples.levels[:, j], samples.final
    x = noised(x0, samples.noise[:, j], s)
    err = x - s.view(-1, 1, 1, 1) * velocity(policy, samples, idx, x, s) - x0
    return err.pow(2).mean((1, 2, 3)) / err.abs().mean((1, 2, 3)).detach().clamp_min(1e-5)


def test_nft_with_equal_rewards_has_no_gradient_at_the_old_policy():
    """r = 1/2 for every sample: the positive and negative policies pull equally and oppositely."""
    nft, policy, params, samples = nft_setup()
    r = nft.sample_weights(torch.zeros(4), 5.0)
    assert torch.equal(r, torch.full((4,), 0.5))
    unequal = objective_gradient(nft, policy, params, samples, torch.tensor([0.9, 0.1, 0.5, 0.5]))
    assert objective_gradient(nft, policy, params, samples, r).norm() < 1e-5 * unequal.norm()


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_nft_gradient_at_the_old_policy_is_reward_weighted_flow_matching(beta):
    """At theta = theta_old, for any beta: grad = loss_scale mean_j mean_i (2 r_i - 1) grad FM_ij,
    FM the normalised flow-matching error (the paper's reduction to a reward-weighted diffusion loss)."""
    nft, policy, params, samples = nft_setup(beta)
    r = torch.tensor([0.95, 0.1, 0.6, 0.3])
    got = objective_gradient(nft, policy, params, samples, r)
    k = samples.levels.shape[1]

    def independent():
        total = sum(((2 * r - 1) * normalised_flow_matching(policy, samples, torch.arange(4), j)).mean() for j in range(k))
        (nft.loss_scale * total / k).backward()

    close(got, gradient(policy, params, independent), rtol=1e-4)


def test_nft_as_beta_goes_to_zero_weights_the_old_policys_error():
    """Away from theta_old, as beta -> 0 the gradient tends to loss_scale (2 r - 1) (-2 s) mean(err_old
    d v / d theta) / |err_old|, the flow-matching gradient taken at the old policy's error."""
    nft, policy, params, samples = nft_setup(beta=1e-6)
    nft.old.tensors = [t + 0.02 * torch.randn_like(t, generator=torch.Generator().manual_seed(i))
                       for i, t in enumerate(nft.old.tensors)]
    r = torch.tensor([0.9, 0.2, 0.7, 0.4])
    got = objective_gradient(nft, policy, params, samples, r)
    idx, k = torch.arange(4), samples.levels.shape[1]

    def independent():
        for j in range(k):
            s, x0 = samples.levels[:, j], samples.final
            x = noised(x0, samples.noise[:, j], s)
            with torch.no_grad(), nft.old.swapped(params):
                err_old = x - s.view(-1, 1, 1, 1) * velocity(policy, samples, idx, x, s) - x0
            v = velocity(policy, samples, idx, x, s)
            per = -2 * s * (err_old * v).mean((1, 2, 3)) / err_old.abs().mean((1, 2, 3)).clamp_min(1e-5)
            (nft.loss_scale * ((2 * r - 1) * per).mean() / k).backward()

    close(got, gradient(policy, params, independent), rtol=1e-3)


def test_nft_rewards_map_to_optimality_probabilities():
    r = DiffusionNFT().sample_weights(torch.tensor([-9.0, -5.0, 0.0, 2.5, 5.0]), 5.0)
    assert torch.allclose(r, torch.tensor([0.0, 0.0, 0.5, 0.75, 1.0]))


def test_nft_samples_from_the_old_policy_and_moves_it_softly():
    nft, policy, params, samples = nft_setup()
    with torch.no_grad():
        for p in params:
            p.add_(0.05 * torch.randn_like(p))
    current = [p.detach().clone() for p in params]
    old = [t.clone() for t in nft.old.tensors]
    with nft.sampling_weights(params):
        assert all(torch.equal(p, o) for p, o in zip(params, old))
    assert all(torch.equal(p, c) for p, c in zip(params, current))  # restored
    nft.after_rollout(params, optimizer_steps=200)  # eta = min(0.5, 0.001 * 200) = 0.2
    for t, o, c in zip(nft.old.tensors, old, current):
        close(t, 0.2 * o + 0.8 * c)
    state = nft.state_dict()
    fresh, _, _, _ = nft_setup()
    fresh.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(fresh.old.tensors, nft.old.tensors))


def test_nft_levels_are_distinct_grid_levels_per_sample():
    levels = DiffusionNFT().draw_levels(32, torch.linspace(1, 0, 11), torch.Generator().manual_seed(0))
    assert levels.shape == (32, 9)  # int(10 * 0.99) of the 10 levels that start a step
    for row in levels:
        assert len(set(row.tolist())) == 9 and all(any(abs(v - g) < 1e-6 for g in torch.linspace(1, 0.1, 10).tolist()) for v in row)


def test_soft_update_schedules():
    assert soft_update_rate(0, 0, 0.001, 0.5) == 0.0
    assert soft_update_rate(100, 0, 0.001, 0.5) == pytest.approx(0.1)
    assert soft_update_rate(10_000, 0, 0.001, 0.5) == 0.5
    assert soft_update_rate(74, 75, 0.0075, 0.999) == 0.0


# ---- counts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("objective, items, nograd", [
    (DiffusionNFT(), 9, 9 * 2),              # 9 of 10 levels; old policy + reference forwards
    (DiffusionNFT(kl_weight=0.0), 9, 9),
    (AWM(), 6, 6 * 2),                         # 6 levels; reference + EMA forwards
    (AWM(kl_weight=0.0, ema_weight=0.0), 6, 0),
])
def test_forwards_and_backward_items_per_sample(objective, items, nograd):
    policy, params, samples = setup(objective, steps=10)
    assert samples.forwards == 10  # the ODE rollout: one call per grid step
    stats, steps = objective.backward(policy, params, samples, torch.zeros(4), torch.arange(4))
    assert (stats["backward_items"], stats["grad_forwards"], stats["nograd_forwards"]) == (items, items, nograd)
    assert len(steps) == items


def test_soft_copy_swaps_in_place_and_restores():
    policy = randomized_policy()
    params = list(policy.parameters())
    copy = SoftCopy(params)
    before = [p.detach().clone() for p in params]
    copy.tensors = [t * 0 for t in copy.tensors]
    with copy.swapped(params):
        assert all(p.abs().max() == 0 for p in params)
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    with pytest.raises(ValueError, match="does not match"):
        copy.load_state_dict(copy.tensors[:-1])


def test_awm_log_prob_refuses_an_unknown_weighting():
    with pytest.raises(ValueError, match="objective.weighting"):
        awm_log_prob(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), "cubic")


def test_soft_copy_follows_the_weights_to_their_dtype_and_device():
    """The module moves to its device after the objective attaches: the copy follows on first use."""
    policy = randomized_policy()
    copy = SoftCopy(list(policy.parameters()))
    policy.double()
    params = list(policy.parameters())
    with copy.swapped(params):
        pass
    copy.update(params, 0.5)
    assert all(t.dtype == torch.float64 for t in copy.tensors)


def test_awm_applies_its_ema_term_only_beside_a_kl_term_as_its_authors_do():
    policy, params, samples = setup(AWM(kl_weight=0.0, ema_weight=1.0), steps=10)
    awm = AWM(kl_weight=0.0, ema_weight=1.0)
    awm.attach(policy, params, 1.0)
    assert awm.ema_weight == 0.0 and awm.ema is None and awm.state_dict() == {}
    with_kl = AWM(kl_weight=0.001, ema_weight=1.0)
    with_kl.attach(policy, params, 1.0)
    assert with_kl.ema is not None


def test_nft_refuses_an_advantage_clip_apart_from_its_loss_scale_naming_both_keys(hydra_cfg, tmp_path):
    from jagg_lab.rundir import ConfigError
    from jagg_lab.train import build

    with pytest.raises(ConfigError, match=r"objective.loss_scale=5 and grpo.adv_clip_max=2 differ"):
        build(hydra_cfg(["objective=nft", "grpo.adv_clip_max=2", "policy=dit_xs"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    build(hydra_cfg(["objective=nft", "grpo.adv_clip_max=2", "objective.loss_scale=2", "policy=dit_xs"]), tmp_path / "ok")
