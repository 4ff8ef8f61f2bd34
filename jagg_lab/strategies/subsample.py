"""`subsample`: the equal-budget baseline - exact gradients of 2 of every W steps, rescaled.

It spends the same number of model backward items as JAGG (2 per window), so it is the
obvious alternative JAGG has to beat at equal cost.
"""
from __future__ import annotations

import torch

from jagg_lab.strategies.base import WindowedStrategy
from jagg_lab.strategies.core import BackwardStats, full_step_backward

__all__ = ["SubsampleStrategy"]


class SubsampleStrategy(WindowedStrategy):
    """per_window: steps trained per window (2 matches JAGG's budget).
    choice: "fixed" takes the window's endpoints (evenly spaced steps if per_window > 2),
    "random" draws them (seeded). Each chosen step's loss is scaled by len(window) / chosen."""

    def __init__(self, window: int = 4, per_window: int = 2, choice: str = "random", seed: int = 0, diagnose_every: int = 0):
        super().__init__(diagnose_every=diagnose_every, window=window, seed=seed)
        if per_window < 1:
            raise ValueError(f"strategy.per_window must be >= 1, got {per_window}")
        if choice not in ("fixed", "random"):
            raise ValueError(f"strategy.choice must be 'fixed' or 'random', got {choice!r}")
        self.per_window = per_window
        self.choice = choice

    def choose(self, steps: list[int]) -> list[int]:
        if len(steps) <= self.per_window:
            return steps
        if self.choice == "random":
            picked = torch.randperm(len(steps), generator=self.generator)[: self.per_window]
            return [steps[i] for i in sorted(picked.tolist())]
        positions = torch.linspace(0, len(steps) - 1, self.per_window).round().long().tolist()
        return [steps[i] for i in positions]

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        stats = BackwardStats()
        for steps in self.windows(len(states)):
            chosen = self.choose(steps)
            scale = len(steps) / len(chosen)
            stats.windows += 1
            for k in chosen:
                stats.add(full_step_backward(velocity_fn, states[k], float(noise_levels[k]), k, step_loss_fn, scale))
        return stats.as_dict()
