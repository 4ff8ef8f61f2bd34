"""`jagg_knots`: JAGG with knots shared by neighbouring segments (docs/method.md section 7).

The Jacobian is interpolated piecewise-linearly (in noise level) between knots: each
trained step's upstream signal g_k is split between its two neighbouring knots with the
weights of section 3 (a knot's own g goes wholly to it), and all knots go through one
joint forward and backward (split into passes of `max_pass_items` knots for bounded memory).
Windows of W spend 2 backward items per W steps; knots every W - 1 steps spend 1.

Adaptive placement (`knot_budget`): choose the M knots that minimise the deviation of the
rollout's cached velocities from their piecewise-linear interpolation between knots,
exactly, by dynamic programming over the trajectory.
"""
from __future__ import annotations

from typing import Sequence

import torch

from jagg_lab.strategies.base import GradientStrategy
from jagg_lab.strategies.core import (
    Segment,
    StepLossFn,
    VelocityFn,
    check_mode,
    check_pass_items,
    effective_mode,
    interpolate_backward,
    interpolation_weights,
)

__all__ = ["uniform_knots", "adaptive_knots", "segment_costs", "knots_backward", "JaggKnotsStrategy"]


def uniform_knots(num_steps: int, spacing: int) -> list[int]:
    """Knots every `spacing` steps; the first and last steps are always knots."""
    if spacing < 1:
        raise ValueError(f"knot_spacing must be >= 1, got {spacing}")
    return sorted(set(range(0, num_steps, spacing)) | {num_steps - 1})


def segment_costs(velocities: Sequence[torch.Tensor], noise_levels: Sequence[float]) -> torch.Tensor:
    """cost[i, j] = sum over i < k < j of ||v_k - ((1 - a_k) v_i + a_k v_j)||^2 (all samples), (K, K).

    The predicted error of interpolating between knots i and j; zero for adjacent steps.
    """
    num = len(velocities)
    flat = torch.stack([v.detach().flatten().double() for v in velocities])  # (K, B*D)
    cost = torch.zeros(num, num, dtype=torch.float64)
    levels = [float(s) for s in noise_levels]
    for i in range(num):
        for j in range(i + 2, num):
            alphas = torch.tensor(interpolation_weights(levels[i : j + 1])[1:-1], dtype=torch.float64)[:, None]
            interp = (1 - alphas) * flat[i] + alphas * flat[j]
            cost[i, j] = ((flat[i + 1 : j] - interp) ** 2).sum()
    return cost


def adaptive_knots(velocities: Sequence[torch.Tensor], noise_levels: Sequence[float], budget: int) -> list[int]:
    """The `budget` knots (first and last included) of least total segment cost (exact DP)."""
    num = len(velocities)
    if budget < min(2, num):
        raise ValueError(f"knot_budget must be >= 2 (the first and last steps are knots), got {budget}")
    if budget >= num:
        return list(range(num))
    cost = segment_costs(velocities, noise_levels)
    inf = float("inf")
    # best[m][j]: least cost of covering steps 0..j with m knots, the last one at j.
    best = [[inf] * num for _ in range(budget + 1)]
    parent = [[-1] * num for _ in range(budget + 1)]
    best[1][0] = 0.0
    for m in range(2, budget + 1):
        for j in range(1, num):
            for i in range(j):
                candidate = best[m - 1][i] + cost[i, j].item()
                if candidate < best[m][j]:
                    best[m][j], parent[m][j] = candidate, i
    knots, j = [], num - 1
    for m in range(budget, 0, -1):
        knots.append(j)
        j = parent[m][j]
    return sorted(knots)


def _resolve_knots(num, knots, knot_spacing, knot_budget, velocities, noise_levels) -> list[int]:
    given = [knots is not None, knot_spacing is not None, knot_budget is not None]
    if sum(given) != 1:
        raise ValueError("set exactly one of knots, knot_spacing and knot_budget")
    if knots is not None:
        bad = [k for k in knots if not 0 <= k < num]
        if bad:
            raise ValueError(f"knots {bad} outside the {num} trained steps")
        return sorted(set(knots) | {0, num - 1})
    if knot_spacing is not None:
        return uniform_knots(num, knot_spacing)
    if velocities is None:
        raise ValueError("knot_budget places knots from the rollout's cached velocities; pass velocities=")
    return adaptive_knots(velocities, noise_levels, knot_budget)


def knots_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    *,
    knots: Sequence[int] | None = None,
    knot_spacing: int | None = None,
    knot_budget: int | None = None,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "recompute",
    max_pass_items: int | None = None,
) -> dict[str, float]:
    """Accumulate the shared-knot JAGG estimate of grad sum_k L_k into .grad.

    Arguments as `jagg_backward`, plus exactly one of `knots` (explicit trained-step indices),
    `knot_spacing` or `knot_budget`; `max_pass_items` bounds the knots per joint forward/backward.
    Stats: backward_passes = chunks, backward_items = knots, `knots` = the positions used.
    """
    num = len(states)
    if num != len(noise_levels):
        raise ValueError(f"got {num} states but {len(noise_levels)} noise levels")
    check_mode(mode, velocities)
    positions = _resolve_knots(num, knots, knot_spacing, knot_budget, velocities, [float(s) for s in noise_levels])
    segments = [Segment(left, right) for left, right in zip(positions[:-1], positions[1:])] or [Segment(positions[0], positions[0])]
    stats = interpolate_backward(velocity_fn, states, noise_levels, step_loss_fn, segments,
                                 velocities=velocities, mode=mode, max_pass_items=max_pass_items)
    out = stats.as_dict()
    out["knots"] = positions
    return out


class JaggKnotsStrategy(GradientStrategy):
    """knot_spacing: steps between knots; or knot_budget: M adaptive knots per micro-batch;
    or knots: explicit trained-step indices (set exactly one). max_pass_items: knots per joint forward/backward (null = all). mode: as `jagg`.
    Logs the knot positions as `knot_<i>` (trained-step index of the i-th knot)."""

    def __init__(self, knot_spacing: int | None = 3, knot_budget: int | None = None, max_pass_items: int | None = None,
                 mode: str = "cached", knots: list[int] | None = None, diagnose_every: int = 0):
        super().__init__(diagnose_every=diagnose_every)
        if sum(x is not None for x in (knot_spacing, knot_budget, knots)) != 1:
            raise ValueError("set exactly one of strategy.knot_spacing, strategy.knot_budget and strategy.knots")
        if knot_spacing is not None and knot_spacing < 1:
            raise ValueError(f"strategy.knot_spacing must be >= 1, got {knot_spacing}")
        if knot_budget is not None and knot_budget < 2:
            raise ValueError(f"strategy.knot_budget must be >= 2, got {knot_budget}")
        check_pass_items(max_pass_items)
        check_mode(mode)
        self.knot_spacing, self.knot_budget, self.max_pass_items, self.mode = knot_spacing, knot_budget, max_pass_items, mode
        self.knots = None if knots is None else [int(k) for k in knots]

    def diagnostic_windows(self, num_steps: int) -> list[list[int]]:
        return [list(range(num_steps))]  # the knots link every segment: one piece

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        mode, fallbacks = effective_mode(self.mode, on_policy)
        stats = knots_backward(
            velocity_fn, states, noise_levels, step_loss_fn, knot_spacing=self.knot_spacing, knot_budget=self.knot_budget,
            knots=self.knots, velocities=velocities, mode=mode, max_pass_items=self.max_pass_items,
        )
        positions = stats.pop("knots")
        stats.update({f"knot_{i}": k for i, k in enumerate(positions)})
        stats["fallbacks"] = fallbacks
        return stats
