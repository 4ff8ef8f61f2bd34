"""docs/method.md sections 3-5: the properties every gradient strategy must satisfy."""
import warnings

import pytest
import torch
from torch import nn

from jagg_lab.strategies import (
    FullStrategy,
    JaggRoutedStrategy,
    JaggStrategy,
    SubsampleStrategy,
    full_backward,
    interpolation_weights,
    jagg_backward,
    partition_windows,
    route_windows,
)
from tests.conftest import cosine, make_module, rollout_and_advantages, strategy_gradient


@pytest.fixture(scope="module")
def real():
    """A tiny DiT along a real 8-step shifted SDE rollout, with CFG and KL on."""
    module = make_module(guidance=3.0, beta=0.05, num_steps=8, train_fraction=1.0)
    rollout, advantages = rollout_and_advantages(module)
    full, full_stats = strategy_gradient(module, FullStrategy(), rollout, advantages)
    return module, rollout, advantages, full, full_stats


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_windows_and_weights():
    assert partition_windows(6, 4) == [[0, 1, 2, 3], [4, 5]]
    assert partition_windows(3, 1) == [[0], [1], [2]]
    # weights follow the noise level, not the step index
    assert interpolation_weights([1.0, 0.9, 0.5, 0.0]) == pytest.approx([0.0, 0.1, 0.5, 1.0])
    # ...or, as the JAGG authors' code places them, the step index: j / (W - 1)
    assert interpolation_weights([1.0, 0.9, 0.5, 0.0], by="index") == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert interpolation_weights([0.8, 0.6, 0.4], by="index") == pytest.approx(interpolation_weights([0.8, 0.6, 0.4]))  # uniform grid
    with pytest.raises(ValueError, match="window"):
        partition_windows(4, 0)
    with pytest.raises(ValueError, match="strategy.weights"):
        interpolation_weights([1.0, 0.5], by="sigma")
    with pytest.raises(ValueError, match="strategy.weights"):
        JaggStrategy(window=4, weights="sigma")


def test_index_weights_equal_noise_weights_on_a_uniform_grid_and_only_there():
    """The authors' j / (W - 1) against ours: the same gradient on a uniform noise grid; on a
    non-uniform one with the states at the noise-level fractions only ours is exact (affine model)."""
    torch.manual_seed(1)
    dim, batch, window = 5, 3, 4
    model = AffineVelocity(dim)
    targets = [torch.randn(batch, dim) for _ in range(window)]

    def loss(k, v):
        return ((v - targets[k]) ** 2).sum() + v.sin().sum()

    def grads(fn, states, levels, **kw):
        model.zero_grad()
        fn(model, states, levels, loss, **kw)
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    a, b = torch.randn(batch, dim), torch.randn(batch, dim)
    for levels in ([1.0, 2 / 3, 1 / 3, 0.0], [1.0, 0.9, 0.6, 0.0]):
        states = [(1 - al) * a + al * b for al in interpolation_weights(levels)]
        full = grads(full_backward, states, levels)
        by_noise = grads(jagg_backward, states, levels, window=window, mode="recompute")
        by_index = grads(jagg_backward, states, levels, window=window, mode="recompute", weights="index")
        assert rel_err(by_noise, full) < 1e-5
        assert (rel_err(by_index, full) < 1e-5) == (levels[1] == 2 / 3)


def test_full_strategy_equals_autograd_of_summed_loss(real):
    module, rollout, advantages, full, stats = real
    module.policy.zero_grad(set_to_none=True)
    idx = torch.arange(rollout.states.shape[0])
    loss_fn = module.objective.loss.step_loss_fn(rollout, idx, advantages, 1.0 / len(module.objective.trained_steps))
    velocity_fn = module.objective.loss.velocity_fn(module.policy, rollout, idx)
    levels = rollout.noise_levels.tolist()
    total = sum(
        loss_fn(j, velocity_fn(rollout.states[:, k], torch.full((len(idx),), levels[k])))
        for j, k in enumerate(module.objective.trained_steps)
    )
    params = module.trainable_parameters()
    expected = torch.cat([g.flatten() for g in torch.autograd.grad(total, params)])
    assert rel_err(full, expected) < 1e-5
    assert stats["backward_passes"] == len(module.objective.trained_steps)


def test_jagg_w2_equals_full(real):
    module, rollout, advantages, full, _ = real
    for mode in ("recompute", "cached", "interpolated"):
        grad, stats = strategy_gradient(module, JaggStrategy(window=2, mode=mode), rollout, advantages)
        assert rel_err(grad, full) < 1e-4, mode
        assert stats["backward_passes"] == 4


def test_jagg_w4_is_close_to_full_on_a_real_rollout(real):
    module, rollout, advantages, full, _ = real
    grad, stats = strategy_gradient(module, JaggStrategy(window=4, mode="recompute"), rollout, advantages)
    assert cosine(grad, full) >= 0.95
    assert rel_err(grad, full) > 1e-6  # an estimate, not a copy of the full gradient
    assert stats["backward_passes"] == 2 and stats["nograd_forwards"] == 4


def test_cached_equals_recompute_on_policy(real):
    module, rollout, advantages, _, _ = real
    cached, stats = strategy_gradient(module, JaggStrategy(window=4, mode="cached"), rollout, advantages)
    recompute, _ = strategy_gradient(module, JaggStrategy(window=4, mode="recompute"), rollout, advantages)
    assert rel_err(cached, recompute) < 1e-4
    assert stats["nograd_forwards"] == 0 and stats["fallbacks"] == 0


def test_cached_falls_back_to_recompute_off_policy(real):
    module, rollout, advantages, _, _ = real
    _, stats = strategy_gradient(module, JaggStrategy(window=4, mode="cached"), rollout, advantages, on_policy=False)
    assert stats["fallbacks"] == 1 and stats["nograd_forwards"] == 4


def test_interpolated_tracks_recompute_after_an_optimizer_step():
    # A wide clip range isolates the velocity estimate: with a tight one the clip mask itself
    # flips for samples whose ratio estimate crosses 1 +- eps (see README, "interpolated").
    module = make_module(guidance=1.0, num_steps=8, clip_range=10.0)
    rollout, advantages = rollout_and_advantages(module)
    opt = torch.optim.AdamW(module.trainable_parameters(), lr=1e-3)
    module.strategy = FullStrategy()
    module.micro_batch_backward(rollout, advantages, torch.arange(8), 1.0, on_policy=True)
    opt.step()  # the parameters now differ from those that sampled the rollout
    module.policy.zero_grad(set_to_none=True)
    recompute, _ = strategy_gradient(module, JaggStrategy(4, "recompute"), rollout, advantages, on_policy=False)
    interp, _ = strategy_gradient(module, JaggStrategy(4, "interpolated"), rollout, advantages, on_policy=False)
    stale, _ = strategy_gradient(module, JaggStrategy(4, "cached"), rollout, advantages, on_policy=True)  # forced stale
    assert cosine(interp, recompute) > 0.999
    # interpolation removes most of the staleness of the rollout's velocities
    assert rel_err(interp, recompute) < 0.5 * rel_err(stale, recompute)


class AffineVelocity(nn.Module):
    """v = A x + b s + c: d v / d theta is affine in (x, s), so JAGG is exact."""

    def __init__(self, dim):
        super().__init__()
        self.A = nn.Parameter(torch.randn(dim, dim) * 0.3)
        self.b = nn.Parameter(torch.randn(dim))
        self.c = nn.Parameter(torch.randn(dim))

    def forward(self, x, s):
        return x @ self.A.T + s[:, None] * self.b + self.c


@pytest.mark.parametrize("window", [3, 4, 8])
def test_jagg_is_exact_for_affine_jacobian_and_collinear_states(window):
    torch.manual_seed(window)
    dim, batch, steps = 5, 3, 8
    model = AffineVelocity(dim)
    levels = torch.sort(torch.rand(steps), descending=True).values.tolist()
    # states on the segment between the endpoints, at the noise-level fraction alpha_k of each window
    start, end = torch.randn(batch, dim), torch.randn(batch, dim)
    states = []
    for steps_w in partition_windows(steps, window):
        alphas = interpolation_weights([levels[k] for k in steps_w])
        a, b = torch.randn(batch, dim), torch.randn(batch, dim)
        states += [(1 - al) * a + al * b for al in alphas]
    targets = [torch.randn(batch, dim) for _ in range(steps)]

    def loss(k, v):  # any nonlinear function of v
        return ((v - targets[k]) ** 2).sum() + v.sin().sum() * (k + 1)

    def grads(fn, **kw):
        model.zero_grad()
        fn(model, states, levels, loss, **kw)
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    full = grads(full_backward)
    jagg = grads(jagg_backward, window=window, mode="recompute")
    assert rel_err(jagg, full) < 1e-5
    # and the states matter: off the segment it is no longer exact
    states[1] = states[1] + 1.0
    assert rel_err(grads(jagg_backward, window=window, mode="recompute"), grads(full_backward)) > 1e-3


def test_jagg_backward_accumulates_and_one_step_window_is_full():
    torch.manual_seed(0)
    model = AffineVelocity(4)
    states = [torch.randn(2, 4) for _ in range(5)]
    levels = [0.9, 0.7, 0.5, 0.3, 0.1]
    loss = lambda k, v: (v**3).sum()  # noqa: E731
    model.zero_grad()
    full_backward(model, states, levels, loss)
    full = [p.grad.clone() for p in model.parameters()]
    # W = 4 leaves a 1-step window [4]; W = 1 is all 1-step windows == full
    model.zero_grad()
    stats = jagg_backward(model, states, levels, loss, window=1)
    assert stats["backward_passes"] == 5
    for p, g in zip(model.parameters(), full):
        torch.testing.assert_close(p.grad, g)
    jagg_backward(model, states, levels, loss, window=1)  # adds, never zeroes
    for p, g in zip(model.parameters(), full):
        torch.testing.assert_close(p.grad, 2 * g)


def test_one_model_backward_per_window_counted_with_hooks(real):
    module, rollout, advantages, _, _ = real
    calls = []
    warnings.filterwarnings("ignore", "Full backward hook is firing")
    handle = module.policy.dit.register_full_backward_hook(lambda *a: calls.append(1))
    try:
        strategy_gradient(module, JaggStrategy(window=4, mode="cached"), rollout, advantages)
        assert len(calls) == 2  # 8 trained steps, W = 4
        calls.clear()
        strategy_gradient(module, JaggStrategy(window=3, mode="recompute"), rollout, advantages)
        assert len(calls) == 3  # windows of 3, 3, 2
        calls.clear()
        strategy_gradient(module, FullStrategy(), rollout, advantages)
        assert len(calls) == 8
    finally:
        handle.remove()


def test_routing_thresholds_reduce_to_jagg_and_full(real):
    module, rollout, advantages, full, _ = real
    jagg, _ = strategy_gradient(module, JaggStrategy(window=4, mode="cached"), rollout, advantages)
    all_jagg, stats = strategy_gradient(module, JaggRoutedStrategy(window=4, cos_threshold=-1.0), rollout, advantages)
    assert rel_err(all_jagg, jagg) < 1e-5 and stats["jagg_frac"] == 1.0
    # Windows of > 2 steps score below 1 unless their velocities are exactly collinear.
    no_jagg, stats = strategy_gradient(module, JaggRoutedStrategy(window=4, cos_threshold=1.0), rollout, advantages)
    assert rel_err(no_jagg, full) < 1e-5 and stats["jagg_frac"] == 0.0
    assert stats["backward_passes"] == 8
    region_scores = [v for k, v in stats.items() if k.startswith("route_score_")]
    assert region_scores and all(-1.0 <= v <= 1.0 for v in region_scores)


def test_routing_target_fraction_is_respected(real):
    module, rollout, advantages, _, _ = real
    # windows [0..2], [3..5], [6, 7]: two that JAGG approximates; the 2-step one is exact either way
    _, stats = strategy_gradient(module, JaggRoutedStrategy(window=3, jagg_frac=0.5), rollout, advantages)
    assert stats["jagg_frac"] == 0.5
    assert stats["backward_items"] == 2 + 3 + 2 and stats["backward_items_saved"] == 1
    # 2-step windows are no routing choice: nothing is approximated, nothing saved
    _, stats = strategy_gradient(module, JaggRoutedStrategy(window=2, cos_threshold=-1.0), rollout, advantages)
    assert stats["jagg_frac"] == 0.0 and stats["backward_items_saved"] == 0
    assert route_windows([0.2, 0.9, 0.5, 0.99], cos_threshold=None, jagg_frac=0.5) == [False, True, False, True]
    assert route_windows([0.2, 0.9], cos_threshold=0.5, jagg_frac=None) == [False, True]


def test_subsample_trains_two_steps_per_window_rescaled(real):
    module, rollout, advantages, _, _ = real
    grad, stats = strategy_gradient(module, SubsampleStrategy(window=4, choice="fixed"), rollout, advantages)
    assert stats["backward_passes"] == 4
    # fixed choice = window endpoints, each scaled by 4 / 2
    module.policy.zero_grad(set_to_none=True)
    idx = torch.arange(rollout.states.shape[0])
    loss_fn = module.objective.loss.step_loss_fn(rollout, idx, advantages, 2.0 / len(module.objective.trained_steps))
    velocity_fn = module.objective.loss.velocity_fn(module.policy, rollout, idx)
    levels = rollout.noise_levels.tolist()
    full_backward(velocity_fn, [rollout.states[:, k] for k in (0, 3, 4, 7)], [levels[k] for k in (0, 3, 4, 7)],
                  lambda j, v: loss_fn((0, 3, 4, 7)[j], v))
    expected = torch.cat([p.grad.flatten() for p in module.trainable_parameters()])
    module.policy.zero_grad(set_to_none=True)
    assert rel_err(grad, expected) < 1e-5


def test_diagnostics_report_cosine_and_keep_the_strategy_gradient(real):
    module, rollout, advantages, full, _ = real
    plain, _ = strategy_gradient(module, JaggStrategy(window=4, mode="cached"), rollout, advantages)
    diag, stats = strategy_gradient(module, JaggStrategy(window=4, mode="cached", diagnose_every=1), rollout, advantages)
    assert rel_err(diag, plain) < 1e-6
    assert stats["grad_cosine"] == pytest.approx(cosine(plain, full), abs=1e-5)
    assert set(stats) >= {"grad_cosine_w0", "grad_cosine_w1", "grad_norm_ratio"}
    _, full_stats = strategy_gradient(module, FullStrategy(diagnose_every=1), rollout, advantages)
    assert full_stats["grad_cosine"] == pytest.approx(1.0, abs=1e-5)


def test_bad_strategy_settings_name_the_key():
    with pytest.raises(ValueError, match="window"):
        JaggStrategy(window=0)
    with pytest.raises(ValueError, match="mode"):
        JaggStrategy(mode="fast")
    with pytest.raises(ValueError, match="jagg_frac"):
        JaggRoutedStrategy(jagg_frac=1.5)
    with pytest.raises(ValueError, match="cos_threshold"):
        JaggRoutedStrategy(cos_threshold=1.5)
    with pytest.raises(ValueError, match="exactly one"):
        JaggRoutedStrategy(cos_threshold=0.5, jagg_frac=0.5)
