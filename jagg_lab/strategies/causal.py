"""`jagg_causal`: Jacobian sharing through causal nodes only (ours).

Plain JAGG pairs step k's upstream signal g_k, which carries the noise injected at step k,
with alpha_k J_b(x_b), and x_b (b > k) is computed from that noise: with a constant advantage
its mean no longer vanishes, which is JAGG's bias (docs/method.md section 8). A Jacobian evaluated at
a state x_n with n <= k does not depend on that noise, so pairing g_k with it keeps the score
identity that makes `full`'s mean zero there. `jagg_causal` shares such nodes between steps:

    J_k ~= J_p(x_p),  p = the latest knot at or before k                  (hold)
    J_k ~= J_p + beta_k (J_p - J_q),  beta_k = (s_k - s_p) / (s_p - s_q)   (extrapolate=True)

with q the knot before p (both causal; the first segment holds). Every step keeps its own
g_k (none is dropped, unlike `subsample`); the estimate pays only the Jacobian's drift along
the trajectory, and all knots go through one joint forward and backward (`route_backward`).

Knots, set exactly one of:
- `window` W: the trained steps in windows of W (`partition_windows`); each window's first
  step is a knot, and with `exact_end` its last step too (2 backward items per window; the
  window's last step gets its exact gradient). Without `exact_end`: 1 item per W steps.
- `knot_spacing`: knots every `knot_spacing` steps, the first and the last trained steps
  included (neighbouring segments share their knot).
- `knots`: explicit trained-step indices (the first step is always added).
"""
from __future__ import annotations

from typing import Sequence

import torch

from jagg_lab.strategies.base import GradientStrategy
from jagg_lab.strategies.core import (
    Route,
    StepLossFn,
    VelocityFn,
    check_mode,
    check_pass_items,
    effective_mode,
    partition_windows,
    route_backward,
)
from jagg_lab.strategies.knots import uniform_knots

__all__ = ["causal_knots", "causal_routes", "jagg_causal_backward", "JaggCausalStrategy"]


def _check_knot_choice(window, knot_spacing, knots, prefix: str = "") -> None:
    if sum(x is not None for x in (window, knot_spacing, knots)) != 1:
        raise ValueError(f"set exactly one of {prefix}window, {prefix}knot_spacing and {prefix}knots")
    if window is not None and window < 1:
        raise ValueError(f"{prefix}window must be >= 1, got {window}")
    if knot_spacing is not None and knot_spacing < 1:
        raise ValueError(f"{prefix}knot_spacing must be >= 1, got {knot_spacing}")


def causal_knots(num_steps: int, *, window: int | None = None, exact_end: bool = True, knot_spacing: int | None = None,
                 knots: Sequence[int] | None = None) -> list[int]:
    """The knot positions (trained-step indices, sorted, the first step always among them)."""
    _check_knot_choice(window, knot_spacing, knots)
    if knots is not None:
        bad = [k for k in knots if not 0 <= k < num_steps]
        if bad:
            raise ValueError(f"knots {bad} outside the {num_steps} trained steps")
        return sorted(set(int(k) for k in knots) | {0})
    if knot_spacing is not None:
        return uniform_knots(num_steps, knot_spacing)
    windows = partition_windows(num_steps, window)
    return sorted({w[0] for w in windows} | ({w[-1] for w in windows} if exact_end else set()))


def causal_routes(positions: Sequence[int], noise_levels: Sequence[float], extrapolate: bool = False) -> list[Route]:
    """Each trained step's route onto the latest knot at or before it (knots: exact), or onto the
    latest two knots by linear extrapolation in noise level."""
    levels = [float(s) for s in noise_levels]
    knots = sorted(positions)
    if not knots or knots[0] != 0:
        raise ValueError(f"the first trained step must be a knot (every step needs one at or before it), got {knots}")
    routes = []
    for k in range(len(levels)):
        earlier = [p for p in knots if p <= k]
        p = earlier[-1]
        if p == k or not extrapolate or len(earlier) < 2:
            routes.append(Route(k, ((p, 1.0),)))
            continue
        q = earlier[-2]
        beta = (levels[k] - levels[p]) / (levels[p] - levels[q])
        routes.append(Route(k, ((p, 1.0 + beta), (q, -beta))))
    return routes


def jagg_causal_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    *,
    window: int | None = 4,
    exact_end: bool = True,
    knot_spacing: int | None = None,
    knots: Sequence[int] | None = None,
    extrapolate: bool = False,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "cached",
    max_pass_items: int | None = None,
) -> dict[str, float]:
    """Accumulate the causal-node estimate of grad sum_k L_k into .grad (adds to existing grads).

    Arguments as `jagg_backward`, plus the knots (exactly one of `window` with `exact_end`,
    `knot_spacing`, `knots`; pass window=None with the other two) and `extrapolate` (see the
    module docstring). Returns stats as `jagg_backward`: backward_passes (joint passes, more
    than one only with `max_pass_items`), backward_items (= knots), forwards, loss, and
    `knots`, the positions used.
    """
    num = len(states)
    if num != len(noise_levels):
        raise ValueError(f"got {num} states but {len(noise_levels)} noise levels")
    check_mode(mode, velocities)
    positions = causal_knots(num, window=window, exact_end=exact_end, knot_spacing=knot_spacing, knots=knots)
    routes = causal_routes(positions, noise_levels, extrapolate)
    stats = route_backward(velocity_fn, states, noise_levels, step_loss_fn, routes, velocities=velocities, mode=mode,
                           max_pass_items=max_pass_items)
    # a segment: a knot with the steps it carries besides its own
    stats.windows = stats.jagg_windows = len({n for r in routes if not r.exact for n, _ in r.nodes[:1]})
    out = stats.as_dict()
    out["knots"] = positions
    return out


class JaggCausalStrategy(GradientStrategy):
    """window + exact_end, or knot_spacing, or knots: where the knots are (set exactly one of
    the three; see the module docstring). extrapolate: linear extrapolation from the latest two
    knots instead of a hold. mode: as `jagg`. max_pass_items: knots per joint forward/backward
    (1: no more rows than `full`'s; null: all). Logs `windows` / `jagg_windows` as the number
    of steps whose Jacobian is shared (not exact)."""

    def __init__(self, window: int | None = 4, exact_end: bool = True, knot_spacing: int | None = None,
                 knots: list[int] | None = None, extrapolate: bool = False, mode: str = "cached",
                 max_pass_items: int | None = None, diagnose_every: int = 0):
        super().__init__(diagnose_every=diagnose_every)
        _check_knot_choice(window, knot_spacing, knots, prefix="strategy.")
        check_mode(mode)
        check_pass_items(max_pass_items)
        self.window, self.exact_end, self.knot_spacing = window, bool(exact_end), knot_spacing
        self.knots = None if knots is None else [int(k) for k in knots]
        self.extrapolate, self.mode, self.max_pass_items = bool(extrapolate), mode, max_pass_items

    def diagnostic_windows(self, num_steps: int) -> list[list[int]]:
        if self.window is not None:
            return partition_windows(num_steps, self.window)
        return [list(range(num_steps))]  # shared knots link every segment: one piece

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        mode, fallbacks = effective_mode(self.mode, on_policy)
        stats = jagg_causal_backward(
            velocity_fn, states, noise_levels, step_loss_fn, window=self.window, exact_end=self.exact_end,
            knot_spacing=self.knot_spacing, knots=self.knots, extrapolate=self.extrapolate, velocities=velocities,
            mode=mode, max_pass_items=self.max_pass_items,
        )
        stats.pop("knots")
        stats["fallbacks"] = fallbacks
        return stats
