"""`jagg_causal`: Jacobian sharing through nodes at or before each step (strategies/causal.py)."""
import warnings

import pytest
import torch
from torch import nn

from jagg_lab.strategies import FullStrategy, JaggCausalStrategy, JaggStrategy, Route, full_backward, jagg_causal_backward, route_backward
from jagg_lab.strategies.causal import causal_knots, causal_routes
from jagg_lab.strategies.base import GradientStrategy
from jagg_lab.strategies.core import upstream_signal
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient
from tests.strategies.test_cv import constant_advantage_errors
from tests.strategies.test_strategies import AffineVelocity, rel_err


@pytest.fixture(scope="module")
def real():
    """A tiny DiT along a real 8-step shifted SDE rollout, with CFG and KL on."""
    module = make_module(guidance=3.0, beta=0.05, num_steps=8, train_fraction=1.0)
    rollout, advantages = rollout_and_advantages(module)
    full, _ = strategy_gradient(module, FullStrategy(), rollout, advantages)
    return module, rollout, advantages, full


def test_knot_positions():
    assert causal_knots(6, window=4) == [0, 3, 4, 5]  # windows [0..3], [4, 5], both ends
    assert causal_knots(6, window=6) == [0, 5]
    assert causal_knots(6, window=5) == [0, 4, 5]
    assert causal_knots(6, window=2, exact_end=False) == [0, 2, 4]
    assert causal_knots(6, knot_spacing=3) == [0, 3, 5]
    assert causal_knots(6, window=None, knots=[3]) == [0, 3]  # the first step is always a knot
    with pytest.raises(ValueError, match="exactly one"):
        causal_knots(6, window=4, knot_spacing=3)
    with pytest.raises(ValueError, match=r"knots \[6\]"):
        causal_knots(6, window=None, knots=[6])


def test_routes_are_causal_and_extrapolate_in_noise_level():
    levels = [1.0, 0.9, 0.75, 0.6, 0.5, 0.3]
    for routes in (causal_routes([0, 3, 5], levels), causal_routes([0, 3, 5], levels, extrapolate=True)):
        assert [r.step for r in routes] == list(range(6))
        assert all(n <= r.step for r in routes for n, _ in r.nodes)  # never a node after the step
        assert all(abs(sum(w for _, w in r.nodes) - 1) < 1e-12 for r in routes)
        assert [r.exact for r in routes] == [True, False, False, True, False, True]
    hold = causal_routes([0, 3, 5], levels)
    assert hold[1].nodes == ((0, 1.0),) and hold[4].nodes == ((3, 1.0),)
    extrap = causal_routes([0, 3, 5], levels, extrapolate=True)
    assert extrap[1].nodes == ((0, 1.0),)  # no knot before the first: a hold
    beta = (0.5 - 0.6) / (0.6 - 1.0)
    (p, wp), (q, wq) = extrap[4].nodes
    assert (p, q) == (3, 0) and wp == pytest.approx(1 + beta) and wq == pytest.approx(-beta)
    with pytest.raises(ValueError, match="first trained step"):
        causal_routes([1, 3], levels)


def test_route_backward_refuses_a_node_without_its_own_exact_step():
    model = AffineVelocity(3)
    states, levels = [torch.randn(2, 3) for _ in range(2)], [0.9, 0.5]
    with pytest.raises(ValueError, match=r"nodes \[0\]"):
        route_backward(model, states, levels, lambda k, v: v.sum(), [Route(1, ((0, 1.0),))], mode="recompute")


class ConstantJacobian(nn.Module):
    """v = c + s * sin(x): d v / d c is the identity at every (x, s), so any sharing of it is exact."""

    def __init__(self, dim):
        super().__init__()
        self.c = nn.Parameter(torch.randn(dim))

    def forward(self, x, s):
        return self.c + s[:, None] * x.sin()


@pytest.mark.parametrize("kwargs", [dict(window=4), dict(window=8, exact_end=False), dict(window=None, knot_spacing=3),
                                    dict(window=None, knot_spacing=3, extrapolate=True)])
def test_exact_when_the_jacobian_does_not_depend_on_the_state(kwargs):
    torch.manual_seed(0)
    dim, steps = 5, 8
    levels = torch.sort(torch.rand(steps), descending=True).values.tolist()
    states = [torch.randn(3, dim) for _ in range(steps)]
    targets = [torch.randn(3, dim) for _ in range(steps)]

    def loss(k, v):  # any nonlinear function of v
        return ((v - targets[k]) ** 2).sum() + v.sin().sum() * (k + 1)

    def grads(model, fn, **kw):
        model.zero_grad()
        fn(model, states, levels, loss, **kw)
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    constant = ConstantJacobian(dim)
    with torch.no_grad():
        velocities = [constant(x, torch.full((3,), s)) for x, s in zip(states, levels)]
    full = grads(constant, full_backward)
    for mode in ("recompute", "cached"):
        assert rel_err(grads(constant, jagg_causal_backward, velocities=velocities, mode=mode, **kwargs), full) < 1e-5
    # a Jacobian that moves with x: the same sharing is an estimate, not the full gradient
    affine = AffineVelocity(dim)
    assert rel_err(grads(affine, jagg_causal_backward, mode="recompute", **kwargs), grads(affine, full_backward)) > 1e-3


def test_window_one_and_every_step_a_knot_are_full(real):
    module, rollout, advantages, full = real
    for strategy in (JaggCausalStrategy(window=1), JaggCausalStrategy(window=2), JaggCausalStrategy(window=None, knot_spacing=1),
                     JaggCausalStrategy(window=None, knots=list(range(8)), extrapolate=True)):
        grad, stats = strategy_gradient(module, strategy, rollout, advantages)
        assert rel_err(grad, full) < 1e-4
        assert stats["backward_items"] == 8


def test_hold_is_the_latest_knots_jacobian_times_every_steps_signal(real):
    """An independent computation of sum_k J_p(k)^T g_k: one exact backward per knot."""
    module, rollout, advantages, _ = real
    grad, stats = strategy_gradient(module, JaggCausalStrategy(window=4), rollout, advantages)  # knots 0, 3, 4, 7
    assert stats["backward_items"] == 4 and stats["backward_passes"] == 1

    captured = {}

    class Capture(GradientStrategy):
        def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
            captured.update(velocity_fn=velocity_fn, states=states, levels=noise_levels, loss=step_loss_fn, velocities=velocities)
            return {}

    strategy_gradient(module, Capture(), rollout, advantages)
    holders = {0: [0, 1, 2], 3: [3], 4: [4, 5, 6], 7: [7]}
    module.policy.zero_grad(set_to_none=True)
    for p, steps in holders.items():
        signal = sum(upstream_signal(captured["loss"], k, captured["velocities"][k])[0] for k in steps)
        x = captured["states"][p]
        v = captured["velocity_fn"](x, torch.full((x.shape[0],), float(captured["levels"][p])))
        (v * signal).sum().backward()
    manual = torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).flatten() for q in module.trainable_parameters()])
    module.policy.zero_grad(set_to_none=True)
    assert rel_err(grad, manual) < 1e-5


def test_backward_passes_and_items_counted_with_hooks(real):
    module, rollout, advantages, _ = real
    rows = []
    warnings.filterwarnings("ignore", "Full backward hook is firing")
    handle = module.policy.dit.register_full_backward_hook(lambda mod, gin, gout: rows.append(gout[0].shape[0]))
    batch = rollout.states.shape[0] * 2  # CFG: two rows per sample in every forward
    try:
        for strategy, items, passes in ((JaggCausalStrategy(window=4), 4, 1), (JaggCausalStrategy(window=8), 2, 1),
                                        (JaggCausalStrategy(window=4, exact_end=False), 2, 1),
                                        (JaggCausalStrategy(window=4, max_pass_items=1), 4, 4)):
            rows.clear()
            _, stats = strategy_gradient(module, strategy, rollout, advantages)
            assert len(rows) == passes == stats["backward_passes"]
            assert sum(rows) == items * batch and stats["backward_items"] == items
    finally:
        handle.remove()


@pytest.mark.parametrize("mode", ["cached", "recompute", "interpolated"])
def test_one_item_per_pass_gives_the_same_gradient(real, mode):
    module, rollout, advantages, _ = real
    for kwargs in (dict(window=4), dict(window=None, knot_spacing=3, extrapolate=True)):
        joint, _ = strategy_gradient(module, JaggCausalStrategy(mode=mode, **kwargs), rollout, advantages)
        split, stats = strategy_gradient(module, JaggCausalStrategy(mode=mode, max_pass_items=1, **kwargs), rollout, advantages)
        assert rel_err(split, joint) < 1e-5
        assert stats["backward_passes"] == stats["backward_items"]


def test_cached_falls_back_to_recompute_off_policy(real):
    module, rollout, advantages, _ = real
    cached, stats = strategy_gradient(module, JaggCausalStrategy(window=4), rollout, advantages, on_policy=False)
    recompute, _ = strategy_gradient(module, JaggCausalStrategy(window=4, mode="recompute"), rollout, advantages)
    assert stats["fallbacks"] == 1 and stats["nograd_forwards"] == 4
    assert rel_err(cached, recompute) < 1e-5


class LatestKnotAfter(GradientStrategy):
    """The anti-causal twin of the hold: each step's Jacobian taken at its window's LAST state."""

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        last = len(states) - 1
        routes = [Route(k, ((last, 1.0),)) for k in range(last + 1)]
        return route_backward(velocity_fn, states, noise_levels, step_loss_fn, routes, velocities=velocities, mode="cached").as_dict()


def test_constant_advantage_mean_is_zero_for_causal_nodes_not_for_later_ones():
    """The score identity: with every advantage equal, E[full gradient] = 0. Nodes at or before
    each step keep it (the error to `full` averages out); the same hold from a later state, like
    plain JAGG, does not."""
    full, errors = constant_advantage_errors({
        "hold": JaggCausalStrategy(window=4, exact_end=False),
        "hold_end": JaggCausalStrategy(window=4),
        "extrapolate": JaggCausalStrategy(window=None, knots=[0, 1], extrapolate=True),
        "later": LatestKnotAfter(),
        "jagg": JaggStrategy(window=4),
    })
    assert full["z"] < 4
    for name in ("hold", "hold_end", "extrapolate"):
        assert errors[name]["z"] < 4, (name, errors[name])
    assert errors["later"]["z"] > 10 and errors["later"]["halves_cosine"] > 0.5
    assert errors["jagg"]["z"] > 10


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="strategy.window, strategy.knot_spacing and strategy.knots"):
        JaggCausalStrategy(window=4, knot_spacing=2)
    with pytest.raises(ValueError, match="strategy.window must be >= 1"):
        JaggCausalStrategy(window=0)
    with pytest.raises(ValueError, match="strategy.knot_spacing must be >= 1"):
        JaggCausalStrategy(window=None, knot_spacing=0)
    with pytest.raises(ValueError, match="strategy.mode"):
        JaggCausalStrategy(mode="stale")
    with pytest.raises(ValueError, match="strategy.max_pass_items"):
        JaggCausalStrategy(max_pass_items=0)
