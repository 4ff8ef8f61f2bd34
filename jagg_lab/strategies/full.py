"""`full`: one forward with grad and one backward per trained step (the reference)."""
from __future__ import annotations

from jagg_lab.strategies.base import GradientStrategy
from jagg_lab.strategies.core import full_backward

__all__ = ["full_backward", "FullStrategy"]


class FullStrategy(GradientStrategy):
    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        return full_backward(velocity_fn, states, noise_levels, step_loss_fn)
