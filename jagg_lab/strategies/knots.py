"""`jagg_knots`: JAGG with knots shared by neighbouring segments (JAGG.md section 7).

The Jacobian is interpolated piecewise-linearly (in noise level) between knots: each
trained step's upstream signal g_k is split between its two neighbouring knots with the
weights of section 3 (a knot's own g goes wholly to it), and all knots go through one
joint forward and backward (chunked into `knot_chunk` knots for bounded memory).
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
    MODES,
    BackwardStats,
    StepLossFn,
    VelocityFn,
    check_mode,
    effective_mode,
    interpolation_weights,
    noise_level_batch,
    upstream_signal,
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
    knot_chunk: int | None = None,
) -> dict[str, float]:
    """Accumulate the shared-knot JAGG estimate of grad sum_k L_k into .grad.

    Arguments as `jagg_backward`, plus exactly one of `knots` (explicit trained-step indices),
    `knot_spacing` or `knot_budget`; `knot_chunk` bounds the knots per joint forward/backward.
    Stats: backward_passes = chunks, backward_items = knots, `knots` = the positions used.
    """
    num = len(states)
    if num != len(noise_levels):
        raise ValueError(f"got {num} states but {len(noise_levels)} noise levels")
    check_mode(mode, velocities)
    levels = [float(s) for s in noise_levels]
    positions = _resolve_knots(num, knots, knot_spacing, knot_budget, velocities, levels)
    chunk = len(positions) if knot_chunk is None else knot_chunk
    if chunk < 1:
        raise ValueError(f"knot_chunk must be >= 1, got {knot_chunk}")
    chunks = [positions[i : i + chunk] for i in range(0, len(positions), chunk)]
    stats = BackwardStats(backward_passes=len(chunks), backward_items=len(positions), windows=max(1, len(positions) - 1))
    stats.jagg_windows = stats.windows

    def forward(steps: list[int]) -> torch.Tensor:
        return velocity_fn(torch.cat([states[k] for k in steps]), torch.cat([noise_level_batch(levels[k], states[k]) for k in steps]))

    batch = states[0].shape[0]
    # Current velocities at the knots: from the joint forward with grad when unchunked; the
    # interpolated mode needs them for every segment up front, hence a no-grad pass when chunked.
    outputs: dict[int, torch.Tensor] = {}
    knot_v: dict[int, torch.Tensor] = {}
    if len(chunks) == 1:
        v = forward(positions)
        stats.grad_forwards += 1
        outputs = {k: v[i * batch : (i + 1) * batch] for i, k in enumerate(positions)}
        knot_v = {k: o.detach() for k, o in outputs.items()}
    elif mode == "interpolated":
        with torch.no_grad():
            for steps in chunks:
                v = forward(steps)
                knot_v.update({k: v[i * batch : (i + 1) * batch] for i, k in enumerate(steps)})
        stats.nograd_forwards += len(chunks)

    signal = {k: None for k in positions}  # G at each knot

    def add(k: int, g: torch.Tensor) -> None:
        signal[k] = g if signal[k] is None else signal[k] + g

    for left, right in zip(positions[:-1], positions[1:]):
        alphas = interpolation_weights(levels[left : right + 1])
        for k, alpha in zip(range(left + 1, right), alphas[1:-1]):
            if mode == "recompute":
                with torch.no_grad():
                    v_k = velocity_fn(states[k], noise_level_batch(levels[k], states[k]))
                stats.nograd_forwards += 1
            elif mode == "cached":
                v_k = velocities[k]
            else:
                v_k = velocities[k] + (1 - alpha) * (knot_v[left] - velocities[left]) + alpha * (knot_v[right] - velocities[right])
            g_k, loss_k = upstream_signal(step_loss_fn, k, v_k)
            add(left, (1 - alpha) * g_k)
            add(right, alpha * g_k)
            stats.loss += loss_k

    for steps in chunks:
        if len(chunks) > 1:
            v = forward(steps)
            stats.grad_forwards += 1
            outputs = {k: v[i * batch : (i + 1) * batch] for i, k in enumerate(steps)}
        surrogate = 0.0
        for k in steps:
            g_k, loss_k = upstream_signal(step_loss_fn, k, outputs[k].detach())
            stats.loss += loss_k
            add(k, g_k)
            surrogate = surrogate + (outputs[k] * signal[k]).sum()
        surrogate.backward()
    out = stats.as_dict()
    out["knots"] = positions
    return out


class JaggKnotsStrategy(GradientStrategy):
    """knot_spacing: steps between knots; or knot_budget: M adaptive knots per micro-batch;
    or knots: explicit trained-step indices (set exactly one). knot_chunk: knots per joint forward/backward (null = all). mode: as `jagg`.
    Logs the knot positions as `knot_<i>` (trained-step index of the i-th knot)."""

    def __init__(self, knot_spacing: int | None = 3, knot_budget: int | None = None, knot_chunk: int | None = None,
                 mode: str = "cached", knots: list[int] | None = None, diagnose_every: int = 0):
        super().__init__(diagnose_every=diagnose_every, window=10**9)
        if sum(x is not None for x in (knot_spacing, knot_budget, knots)) != 1:
            raise ValueError("set exactly one of strategy.knot_spacing, strategy.knot_budget and strategy.knots")
        if knot_spacing is not None and knot_spacing < 1:
            raise ValueError(f"strategy.knot_spacing must be >= 1, got {knot_spacing}")
        if knot_budget is not None and knot_budget < 2:
            raise ValueError(f"strategy.knot_budget must be >= 2, got {knot_budget}")
        if knot_chunk is not None and knot_chunk < 1:
            raise ValueError(f"strategy.knot_chunk must be >= 1, got {knot_chunk}")
        if mode not in MODES:
            raise ValueError(f"strategy.mode must be one of {MODES}, got {mode!r}")
        self.knot_spacing, self.knot_budget, self.knot_chunk, self.mode = knot_spacing, knot_budget, knot_chunk, mode
        self.knots = None if knots is None else [int(k) for k in knots]

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        mode, fallbacks = effective_mode(self.mode, on_policy)
        stats = knots_backward(
            velocity_fn, states, noise_levels, step_loss_fn, knot_spacing=self.knot_spacing, knot_budget=self.knot_budget,
            knots=self.knots, velocities=velocities, mode=mode, knot_chunk=self.knot_chunk,
        )
        positions = stats.pop("knots")
        stats.update({f"knot_{i}": k for i, k in enumerate(positions)})
        stats["fallbacks"] = fallbacks
        return stats
