"""The GRPO trajectory objective (`objective=grpo`, the default): SDE rollouts, and the clipped
GRPO loss of their trained steps pushed through the policy by a gradient strategy.

Its settings are conf/grpo (clip range, trained steps, KL, moving window, drawn blocks) and
conf/sampler; its loss and gradient phase are the pure functions of `jagg_lab.grpo.objective`
(`GRPOObjective`), which benchmarks and tests call directly.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch import nn

from jagg_lab.grpo.config import GRPOConfig
from jagg_lab.grpo.loss import StepStats
from jagg_lab.grpo.objective import GRPOObjective
from jagg_lab.objectives.base import Objective
from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.policies.reference import reference_policy
from jagg_lab.sampling import SDESampler, sde_rollout
from jagg_lab.strategies import GradientStrategy
from jagg_lab.types import Cond, Rollout

__all__ = ["TrajectoryGRPO"]


class TrajectoryGRPO(Objective):
    """The GRPO loss of the sampled SDE steps, through the run's gradient strategy. After
    `setup`: `loss` is the `GRPOObjective` of the run's settings, `trained_steps` its trained
    sampling steps, `ref_policy` the KL reference (grpo.beta > 0)."""

    name = "grpo"
    trajectory = True

    def __init__(self) -> None:
        super().__init__()
        self.compiled_forward = None

    def check(self, cfg, grpo: GRPOConfig, sampler: SDESampler, strategy: GradientStrategy) -> list[str]:
        """Drawn blocks need a strategy that keeps to them (GRPOObjective.check_strategy)."""
        try:
            GRPOObjective.from_config(grpo, sampler.num_steps, sampler.guidance).check_strategy(strategy)
        except ValueError as err:
            return [str(err)]
        return []

    def setup(self, policy, params, sampler, grpo, strategy, seed=0) -> None:
        super().setup(policy, params, sampler, grpo, strategy, seed)
        self.loss = GRPOObjective.from_config(grpo, sampler.num_steps, sampler.guidance)
        self.loss.check_strategy(strategy)
        self.trained_steps = list(self.loss.trained_steps)
        if grpo.sde_window is None:  # checked before any work; a moving SDE window has its phases per rollout
            sampler.ode_phases(self.trained_steps)
        self.ref_policy = reference_policy(policy) if grpo.beta else None  # the policy as it starts

    def compile(self, policy: nn.Module, on: bool) -> None:
        """A function, not a module, so the state dict keeps one copy of the weights."""
        self.compiled_forward = torch.compile(policy.forward) if on else None

    # ---- draws of a rollout ------------------------------------------------------------
    def sde_window_steps(self, index: int) -> list[int]:
        """The trained steps of rollout `index` under a moving SDE window (its own draw: the
        rollout's noise is the same as without a window)."""
        draw = torch.Generator().manual_seed(2**40 + self.seed * 1_000_003 + index)  # apart from the noise seeds
        return self.grpo.sde_window_steps(self.sampler.num_steps, index, draw)

    def block_generator(self, idx: torch.Tensor, index: int, rank: int = 0) -> torch.Generator | None:
        """The draw of micro-batch `idx`'s trained blocks (grpo.block_fraction < 1; else None), from
        the run's seed, rollout `index` and the micro-batch's first row on `rank`: a resumed step draws the same."""
        if not self.grpo.draws_blocks:
            return None
        rollout = 2**41 + self.seed * 1_000_003 + index  # apart from the noise and window seeds
        return torch.Generator().manual_seed(rollout * 1_000_033 + rank * 100_003 + int(idx[0]))

    # ---- the stages --------------------------------------------------------------------
    def sample(self, policy, params, cond: Cond, null_cond: Cond, noise, generator, shard=(0, 1), index=0,
               sampler: SDESampler | None = None) -> Rollout:
        """SDE rollouts of this rank's rows, with the log-probs (and KL reference means) of the
        trained steps."""
        sampler = sampler or self.sampler
        guidance = sampler.guidance
        window = self.sde_window_steps(index) if self.grpo.sde_window is not None else None
        phases = sampler.window_phases(window) if window is not None else sampler.ode_phases(self.trained_steps)
        forward = self.compiled_forward or policy
        rollout = sde_rollout(
            guided_velocity_fn(forward, cond, null_cond, guidance), noise, sampler.noise_levels(policy).to(noise.device),
            noise_level=sampler.noise_level, cond=cond, null_cond=null_cond, reduction=sampler.log_prob_reduction,
            ref_velocity_fn=guided_velocity_fn(self.ref_policy, cond, null_cond, guidance) if self.ref_policy is not None else None,
            ref_steps=window or self.trained_steps, generator=generator, shard=shard, **phases,
        )
        if window is not None:
            rollout = dataclasses.replace(rollout, trained_steps=tuple(window))
        return rollout.for_training()

    def backward(self, policy, params: Sequence[nn.Parameter], batch: Rollout, weights, idx, scale=1.0, on_policy=True,
                 shard=(0, 1), index=0) -> tuple[dict, list[StepStats]]:
        return self.loss.backward(self.strategy, policy, batch, weights, idx, scale=scale, on_policy=on_policy,
                                  params=params, draw=self.block_generator(idx, index, shard[0]))

    def reference_calls(self, batch: Rollout) -> int:
        return len(self.loss.steps_of(batch)) if self.ref_policy is not None else 0
