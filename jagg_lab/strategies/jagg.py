"""`jagg`: Jacobian-Aggregated Group Gradient (docs/method.md sections 3-4).

Inside a window [a..b] the Jacobian of the velocity is interpolated linearly in noise
level, J_k ~ (1 - alpha_k) J_a + alpha_k J_b, so the window's gradient collapses to
J_a^T G_a + J_b^T G_b with G_a = sum (1 - alpha_k) g_k and G_b = sum alpha_k g_k:
one forward of both endpoint batches together and ONE backward per window.
"""
from __future__ import annotations

from typing import Sequence

import torch

from jagg_lab.strategies.base import WindowedStrategy
from jagg_lab.strategies.core import (
    MODES,
    BackwardStats,
    Segment,
    StepLossFn,
    VelocityFn,
    check_mode,
    check_pass_items,
    check_weights,
    effective_mode,
    interpolate_backward,
    partition_windows,
)

__all__ = ["MODES", "jagg_window_backward", "jagg_backward", "JaggStrategy"]


def jagg_window_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    steps: Sequence[int],
    *,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "recompute",
    max_pass_items: int | None = None,
    weights: str = "noise",
) -> BackwardStats:
    """JAGG over one window of trained-step indices `steps` (consecutive, in sampling order)."""
    return interpolate_backward(velocity_fn, states, noise_levels, step_loss_fn, [Segment(steps[0], steps[-1])],
                                velocities=velocities, mode=mode, max_pass_items=max_pass_items, weights=weights)


def jagg_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    *,
    window: int = 4,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "recompute",
    max_pass_items: int | None = None,
    weights: str = "noise",
) -> dict[str, float]:
    """Accumulate the JAGG estimate of grad sum_k L_k into .grad (adds to existing grads).

    velocity_fn(x, s): the model call, x (n*B, *X) -> v (n*B, *X) for n stacked copies of
    the B rows (JAGG stacks its two endpoints). states: K tensors (B, *X), the trained
    steps' inputs in sampling order. noise_levels: K floats s_k. step_loss_fn(k, v): loss
    of trained step k as a function of v. velocities: the rollout's K velocities, needed by
    `cached` and `interpolated`. `cached` is exact only while the parameters are those that
    sampled the rollout; the caller must know that. max_pass_items: at most this many
    batches of B rows per joint pass (1: the rows `full` uses; None: both endpoints at once).
    weights: alpha_k by "noise" level (default) or by "index" in the window (the JAGG authors'
    j / (W - 1)); they coincide on a uniform grid.
    Returns stats: backward_passes (= windows), backward_items, forwards, loss.
    """
    if len(states) != len(noise_levels):
        raise ValueError(f"got {len(states)} states but {len(noise_levels)} noise levels")
    check_mode(mode, velocities)
    stats = BackwardStats()
    for steps in partition_windows(len(states), window):
        stats.add(jagg_window_backward(velocity_fn, states, noise_levels, step_loss_fn, steps, velocities=velocities,
                                       mode=mode, max_pass_items=max_pass_items, weights=weights))
    return stats.as_dict()


class JaggStrategy(WindowedStrategy):
    """window: W trained steps per window. mode: recompute | cached | interpolated.
    `cached` falls back to `recompute` (counted in `fallbacks`) once the parameters moved.
    max_pass_items: batches of B rows per joint pass (1: no more than `full`'s; null: all).
    weights: the interpolation weights by "noise" level or by step "index" (the authors')."""

    def __init__(self, window: int = 4, mode: str = "cached", max_pass_items: int | None = None, diagnose_every: int = 0,
                 weights: str = "noise"):
        super().__init__(window=window, diagnose_every=diagnose_every)
        check_mode(mode)
        check_pass_items(max_pass_items)
        check_weights(weights)
        self.mode, self.max_pass_items, self.weights = mode, max_pass_items, weights

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        mode, fallbacks = effective_mode(self.mode, on_policy)
        stats = jagg_backward(
            velocity_fn, states, noise_levels, step_loss_fn, window=self.window, velocities=velocities, mode=mode,
            max_pass_items=self.max_pass_items, weights=self.weights,
        )
        stats["fallbacks"] = fallbacks
        return stats
