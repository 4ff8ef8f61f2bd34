"""The gradient-strategy interface, its windowed form, and optional diagnostics against `full`."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Sequence

import torch

from jagg_lab.strategies.core import StepLossFn, VelocityFn, flat_grad, full_backward, partition_windows

__all__ = ["GradientStrategy", "WindowedStrategy"]


def _zero(params: list[torch.Tensor]) -> None:
    for p in params:
        p.grad = None


class GradientStrategy(ABC):
    """Receives the policy call, one micro-batch's trained steps and the per-step loss;
    accumulates gradients into `.grad`; returns stats (at least `backward_passes`).

    diagnose_every: every N-th call also computes the full gradient on the same
    micro-batch and reports `grad_cosine`, `grad_norm_ratio` and per-window cosines
    (`grad_cosine_w{i}`, over `diagnostic_windows`); the accumulated gradient is still the
    strategy's own. The extra passes call the step loss again after the strategy's own
    pass, so a caller that records loss statistics keeps the first value of each step.
    """

    def __init__(self, diagnose_every: int = 0):
        if diagnose_every < 0:
            raise ValueError(f"strategy.diagnose_every must be >= 0, got {diagnose_every}")
        self.diagnose_every = diagnose_every
        self.calls = 0

    def state_dict(self) -> dict:
        """What a checkpoint needs for an exact resume (counters, random state)."""
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def diagnostic_windows(self, num_steps: int) -> list[list[int]]:
        """The groups of trained steps the diagnostics compare one by one (default: each step)."""
        return partition_windows(num_steps, 1)

    @abstractmethod
    def backward(
        self,
        velocity_fn: VelocityFn,
        states: Sequence[torch.Tensor],
        noise_levels: Sequence[float],
        step_loss_fn: StepLossFn,
        velocities: Sequence[torch.Tensor] | None = None,
        on_policy: bool = True,
    ) -> dict[str, float]:
        """Accumulate this strategy's gradient of sum_k L_k into .grad and return stats."""

    def __call__(
        self,
        velocity_fn: VelocityFn,
        states: Sequence[torch.Tensor],
        noise_levels: Sequence[float],
        step_loss_fn: StepLossFn,
        *,
        velocities: Sequence[torch.Tensor] | None = None,
        on_policy: bool = True,
        params: Iterable[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        self.calls += 1
        if self.diagnose_every and params is not None and (self.calls - 1) % self.diagnose_every == 0:
            return self.diagnose(velocity_fn, states, noise_levels, step_loss_fn, velocities, on_policy, list(params))
        return self.backward(velocity_fn, states, noise_levels, step_loss_fn, velocities, on_policy)

    def diagnose(self, velocity_fn, states, noise_levels, step_loss_fn, velocities, on_policy, params) -> dict[str, float]:
        params = [p for p in params if p.requires_grad]
        saved = [p.grad for p in params]
        _zero(params)
        stats = self.backward(velocity_fn, states, noise_levels, step_loss_fn, velocities, on_policy)
        own = [p.grad for p in params]
        stats.update(self._compare(velocity_fn, states, noise_levels, step_loss_fn, velocities, on_policy, params, flat_grad(params)))
        for p, before, mine in zip(params, saved, own):
            p.grad = mine if before is None else (before if mine is None else before + mine)
        return stats

    def _compare(self, velocity_fn, states, noise_levels, step_loss_fn, velocities, on_policy, params, g_strategy) -> dict[str, float]:
        """Cosines of the strategy's gradient to the full one, overall and per window."""
        stats = {}
        _zero(params)
        full_backward(velocity_fn, states, noise_levels, step_loss_fn)
        g_full = flat_grad(params)
        stats["grad_cosine"] = torch.nn.functional.cosine_similarity(g_strategy, g_full, dim=0).item()
        stats["grad_norm_ratio"] = (g_strategy.norm() / g_full.norm().clamp_min(1e-30)).item()
        for w, steps in enumerate(self.diagnostic_windows(len(states))):
            sub_states = [states[k] for k in steps]
            sub_levels = [noise_levels[k] for k in steps]
            sub_vel = None if velocities is None else [velocities[k] for k in steps]

            def sub_loss(j: int, v: torch.Tensor, steps=steps) -> torch.Tensor:
                return step_loss_fn(steps[j], v)

            _zero(params)
            self.backward(velocity_fn, sub_states, sub_levels, sub_loss, sub_vel, on_policy)
            g_w = flat_grad(params)
            _zero(params)
            full_backward(velocity_fn, sub_states, sub_levels, sub_loss)
            stats[f"grad_cosine_w{w}"] = torch.nn.functional.cosine_similarity(g_w, flat_grad(params), dim=0).item()
        return stats


class WindowedStrategy(GradientStrategy):
    """A strategy that works window by window over the trained steps, `window` steps each
    (a shorter leftover window closes the list); diagnostics compare window by window.
    seed: a strategy that draws (which steps to train or correct) passes one and draws from
    `self.generator`; its state is part of `state_dict`, so a resumed run draws what it would
    have. Strategies that draw nothing keep no generator (None)."""

    def __init__(self, window: int = 4, diagnose_every: int = 0, seed: int | None = None):
        super().__init__(diagnose_every=diagnose_every)
        if window < 1:
            raise ValueError(f"strategy.window must be >= 1, got {window}")
        if seed is not None and seed < 0:
            raise ValueError(f"strategy.seed must be >= 0, got {seed}")
        self.window = window
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict:
        state = super().state_dict()
        return state if self.generator is None else {**state, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.generator is not None:
            self.generator.set_state(state["generator"])

    def windows(self, num_steps: int) -> list[list[int]]:
        return partition_windows(num_steps, self.window)

    def diagnostic_windows(self, num_steps: int) -> list[list[int]]:
        return self.windows(num_steps)
