"""`jagg`: Jacobian-Aggregated Group Gradient (JAGG.md sections 3-4).

Inside a window [a..b] the Jacobian of the velocity is interpolated linearly in noise
level, J_k ~ (1 - alpha_k) J_a + alpha_k J_b, so the window's gradient collapses to
J_a^T G_a + J_b^T G_b with G_a = sum (1 - alpha_k) g_k and G_b = sum alpha_k g_k:
one forward of both endpoint batches together and ONE backward per window.
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
    full_step_backward,
    interpolation_weights,
    noise_level_batch,
    partition_windows,
    upstream_signal,
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
) -> BackwardStats:
    """JAGG over one window of trained-step indices `steps` (consecutive, in sampling order)."""
    if len(steps) == 1:
        k = steps[0]
        return full_step_backward(velocity_fn, states[k], float(noise_levels[k]), k, step_loss_fn)
    a, b = steps[0], steps[-1]
    levels = [float(noise_levels[k]) for k in steps]
    alphas = interpolation_weights(levels)
    x_a, x_b = states[a], states[b]
    batch = x_a.shape[0]
    # One forward of the two endpoint batches together; the model sees 2B rows (4B with CFG).
    v_ab = velocity_fn(torch.cat([x_a, x_b]), torch.cat([noise_level_batch(levels[0], x_a), noise_level_batch(levels[-1], x_b)]))
    v_a, v_b = v_ab[:batch], v_ab[batch:]
    stats = BackwardStats(backward_passes=1, backward_items=2, grad_forwards=1, windows=1, jagg_windows=1)
    g_a = torch.zeros_like(v_a)
    g_b = torch.zeros_like(v_b)
    for k, s, alpha in zip(steps, levels, alphas):
        if k == a:
            v_k = v_a.detach()
        elif k == b:
            v_k = v_b.detach()
        elif mode == "recompute":
            with torch.no_grad():
                v_k = velocity_fn(states[k], noise_level_batch(s, states[k]))
            stats.nograd_forwards += 1
        elif mode == "cached":
            v_k = velocities[k]
        else:  # interpolated: carry the endpoints' parameter change over to step k
            v_k = (
                velocities[k]
                + (1 - alpha) * (v_a.detach() - velocities[a])
                + alpha * (v_b.detach() - velocities[b])
            )
        g_k, loss_k = upstream_signal(step_loss_fn, k, v_k)
        g_a += (1 - alpha) * g_k
        g_b += alpha * g_k
        stats.loss += loss_k
    ((v_a * g_a).sum() + (v_b * g_b).sum()).backward()
    return stats


def jagg_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    *,
    window: int = 4,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "recompute",
) -> dict[str, float]:
    """Accumulate JAGG's estimate of grad sum_k L_k into .grad; one model backward per window.

    velocity_fn(x, s) -> v is the model call (x: (B, ...), s: (B,) noise levels).
    states: K tensors x_k, the inputs of the K trained steps in sampling order.
    noise_levels: K floats s_k. step_loss_fn(k, v): loss of trained step k as a function of v.
    velocities: K cached rollout velocities, needed by mode "cached" and "interpolated".
    mode: where intermediate velocities come from (JAGG.md section 4). "cached" is exact only
    while the parameters are those that sampled the rollout; the caller must know that.
    Returns stats: backward_passes (= windows), backward_items, forwards, loss.
    """
    if len(states) != len(noise_levels):
        raise ValueError(f"got {len(states)} states but {len(noise_levels)} noise levels")
    check_mode(mode, velocities)
    stats = BackwardStats()
    for steps in partition_windows(len(states), window):
        stats.add(jagg_window_backward(velocity_fn, states, noise_levels, step_loss_fn, steps, velocities=velocities, mode=mode))
    return stats.as_dict()


class JaggStrategy(GradientStrategy):
    """window: W trained steps per window. mode: recompute | cached | interpolated.
    `cached` falls back to `recompute` (counted in `fallbacks`) once the parameters moved."""

    def __init__(self, window: int = 4, mode: str = "cached", diagnose_every: int = 0):
        super().__init__(diagnose_every=diagnose_every, window=window)
        if mode not in MODES:
            raise ValueError(f"strategy.mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        mode, fallbacks = effective_mode(self.mode, on_policy)
        stats = jagg_backward(
            velocity_fn, states, noise_levels, step_loss_fn, window=self.window, velocities=velocities, mode=mode
        )
        stats["fallbacks"] = fallbacks
        return stats
