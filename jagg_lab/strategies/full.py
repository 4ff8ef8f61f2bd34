"""`full`: one forward with grad and one backward per trained step (the reference)."""
from __future__ import annotations

from typing import Sequence

import torch

from jagg_lab.strategies.base import GradientStrategy
from jagg_lab.strategies.core import BackwardStats, StepLossFn, VelocityFn, full_step_backward

__all__ = ["full_backward", "FullStrategy"]


def full_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
) -> dict[str, float]:
    """Accumulate the exact gradient of sum_k L_k into .grad: K forwards with grad, K backwards."""
    stats = BackwardStats()
    for k, (state, s) in enumerate(zip(states, noise_levels)):
        stats.add(full_step_backward(velocity_fn, state, float(s), k, step_loss_fn))
    return stats.as_dict()


class FullStrategy(GradientStrategy):
    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        return full_backward(velocity_fn, states, noise_levels, step_loss_fn)
