"""Shared-knot JAGG (docs/method.md section 7) and adaptive knot placement."""
import pytest
import torch

from jagg_lab.strategies import (
    FullStrategy,
    JaggKnotsStrategy,
    JaggStrategy,
    adaptive_knots,
    full_backward,
    jagg_backward,
    knots_backward,
    uniform_knots,
)
from tests.conftest import cosine, make_module, rollout_and_advantages, strategy_gradient
from tests.strategies.test_strategies import AffineVelocity, rel_err


@pytest.fixture(scope="module")
def real():
    module = make_module(guidance=3.0, num_steps=9, train_fraction=1.0)
    rollout, advantages = rollout_and_advantages(module)
    full, _ = strategy_gradient(module, FullStrategy(), rollout, advantages)
    return module, rollout, advantages, full


def test_uniform_knots_always_include_first_and_last():
    assert uniform_knots(9, 3) == [0, 3, 6, 8]
    assert uniform_knots(9, 4) == [0, 4, 8]
    assert uniform_knots(5, 1) == [0, 1, 2, 3, 4]


def test_knot_spacing_one_is_the_full_gradient(real):
    module, rollout, advantages, full = real
    grad, stats = strategy_gradient(module, JaggKnotsStrategy(knot_spacing=1, mode="recompute"), rollout, advantages)
    assert rel_err(grad, full) < 1e-4
    assert stats["backward_passes"] == 1 and stats["backward_items"] == 9


def test_window_endpoint_knots_reproduce_windowed_jagg():
    torch.manual_seed(0)
    model = AffineVelocity(4)
    with torch.no_grad():
        model.A.copy_(torch.randn(4, 4))
    states = [torch.randn(3, 4) for _ in range(8)]
    levels = torch.linspace(1.0, 0.1, 8).tolist()
    loss = lambda k, v: (v.tanh() * (k + 1)).sum()  # noqa: E731

    def grads(fn, **kw):
        model.zero_grad()
        fn(model, states, levels, loss, **kw)
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    # nonlinear in the states, so neither is exact; they must still agree with each other
    windowed = grads(jagg_backward, window=4)
    knotted = grads(knots_backward, knots=[0, 3, 4, 7])
    assert rel_err(knotted, windowed) < 1e-6
    assert rel_err(windowed, grads(full_backward)) > 1e-4


def test_exact_for_affine_jacobian_with_collinear_states():
    torch.manual_seed(1)
    model = AffineVelocity(5)
    levels = [1.0, 0.85, 0.7, 0.5, 0.35, 0.2, 0.1]
    knots = [0, 3, 6]
    ends = {k: torch.randn(2, 5) for k in knots}
    states = []
    for k, s in enumerate(levels):
        left = max(kn for kn in knots if kn <= k)
        right = min(kn for kn in knots if kn >= k)
        alpha = 0.0 if left == right else (s - levels[left]) / (levels[right] - levels[left])
        states.append((1 - alpha) * ends[left] + alpha * ends[right])
    loss = lambda k, v: ((v - 0.3 * k) ** 2).sum() + v.sin().sum()  # noqa: E731
    model.zero_grad()
    full_backward(model, states, levels, loss)
    full = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    stats = knots_backward(model, states, levels, loss, knot_spacing=3)
    assert stats["backward_items"] == 3 and stats["backward_passes"] == 1
    assert rel_err(torch.cat([p.grad.flatten() for p in model.parameters()]), full) < 1e-5


def test_chunking_changes_memory_not_the_gradient(real):
    module, rollout, advantages, _ = real
    for mode in ("cached", "interpolated", "recompute"):
        whole, _ = strategy_gradient(module, JaggKnotsStrategy(knot_spacing=2, mode=mode), rollout, advantages)
        chunked, stats = strategy_gradient(module, JaggKnotsStrategy(knot_spacing=2, max_pass_items=2, mode=mode), rollout, advantages)
        assert rel_err(chunked, whole) < 1e-5, mode
        assert stats["backward_passes"] == 3 and stats["backward_items"] == 5


def test_knots_are_close_to_full_on_a_real_rollout_with_fewer_items_than_windows(real):
    module, rollout, advantages, full = real
    knotted, kstats = strategy_gradient(module, JaggKnotsStrategy(knot_spacing=3, mode="cached"), rollout, advantages)
    windowed, wstats = strategy_gradient(module, JaggStrategy(window=4, mode="cached"), rollout, advantages)
    assert kstats["backward_items"] < wstats["backward_items"]  # 4 knots vs 2 + 2 + 1 endpoint batches
    assert cosine(knotted, full) > 0.95


def _kinked(kink: int, steps: int = 13, dim: int = 6):
    """An affine-Jacobian model along a trajectory whose states turn a corner at `kink`."""
    torch.manual_seed(2)
    model = AffineVelocity(dim)
    levels = torch.linspace(1.0, 0.04, steps).tolist()
    a, b, c = torch.randn(2, dim), torch.randn(2, dim) * 3, torch.randn(2, dim)
    states = []
    for k, s in enumerate(levels):
        if k <= kink:
            t = (s - levels[0]) / (levels[kink] - levels[0])
            states.append((1 - t) * a + t * b)
        else:
            t = (s - levels[kink]) / (levels[-1] - levels[kink])
            states.append((1 - t) * b + t * c)
    with torch.no_grad():
        velocities = [model(x, torch.full((2,), s)) for x, s in zip(states, levels)]
    return model, states, levels, velocities


def test_adaptive_knots_find_the_kink_and_never_lose_to_uniform():
    model, states, levels, velocities = _kinked(kink=5)
    loss = lambda k, v: (v**2).sum() + v.cos().sum()  # noqa: E731

    def grads(**kw):
        model.zero_grad()
        knots_backward(model, states, levels, loss, velocities=velocities, mode="cached", **kw)
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    model.zero_grad()
    full_backward(model, states, levels, loss)
    full = torch.cat([p.grad.flatten() for p in model.parameters()])
    for budget in (3, 4, 5):
        knots = adaptive_knots(velocities, levels, budget)
        assert len(knots) == budget and knots[0] == 0 and knots[-1] == 12 and 5 in knots
        spacing = -(-12 // (budget - 1))
        uniform = grads(knot_spacing=spacing)
        adaptive = grads(knot_budget=len(uniform_knots(13, spacing)))
        assert cosine(adaptive, full) >= cosine(uniform, full) - 1e-9
    assert rel_err(grads(knot_budget=3), full) < 1e-5  # knots at 0, 5, 12: exact


def test_knot_settings_are_validated():
    with pytest.raises(ValueError, match="exactly one"):
        JaggKnotsStrategy(knot_spacing=2, knot_budget=4)
    with pytest.raises(ValueError, match="knot_budget"):
        JaggKnotsStrategy(knot_spacing=None, knot_budget=1)
    with pytest.raises(ValueError, match="max_pass_items"):
        JaggKnotsStrategy(max_pass_items=0)
