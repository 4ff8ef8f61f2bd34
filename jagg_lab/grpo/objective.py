"""The GRPO objective of one rollout, as pure functions the module, benchmarks and tests share.

rewards -> advantages (`rollout_advantages`); a micro-batch's per-step loss as a function of
the velocity (`GRPOObjective.step_loss_fn`); and the gradient phase, a gradient strategy
pushing those losses through the policy (`GRPOObjective.backward`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from jagg_lab.grpo.advantages import group_advantages
from jagg_lab.grpo.config import GRPOConfig, draw_blocks
from jagg_lab.grpo.loss import GRPOLoss, StepStats
from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.strategies import FullStrategy, GradientStrategy
from jagg_lab.strategies.core import StepLossFn, VelocityFn
from jagg_lab.types import Rollout, index_cond

__all__ = ["rollout_advantages", "GRPOObjective"]


def rollout_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, grpo: GRPOConfig, shuffle: torch.Generator | None = None
) -> torch.Tensor:
    """Group advantages of a whole batch, (B,). With grpo.shuffle_advantages (a control run)
    they are permuted across the batch by `shuffle`, which the caller seeds per rollout."""
    advantages = group_advantages(rewards, group_ids, std=grpo.adv_std, clip_max=grpo.adv_clip_max)
    if grpo.shuffle_advantages:
        if shuffle is None:
            raise ValueError("grpo.shuffle_advantages needs a generator for the permutation")
        advantages = advantages[torch.randperm(len(advantages), generator=shuffle).to(advantages.device)]
    return advantages


@dataclass(frozen=True)
class GRPOObjective:
    """The loss of the trained steps of a rollout. loss: the clipped per-step objective.
    trained_steps: sampling-step indices that receive gradients. guidance: the CFG scale the
    rollout was sampled with (the loss re-evaluates the same guided velocity). block_size,
    block_fraction: each micro-batch trains a random share of the blocks of the trained steps
    (see GRPOConfig; fraction 1: all of them)."""

    loss: GRPOLoss
    trained_steps: tuple[int, ...]
    guidance: float = 1.0
    block_size: int | None = None
    block_fraction: float = 1.0

    @classmethod
    def from_config(cls, grpo: GRPOConfig, num_steps: int, guidance: float) -> "GRPOObjective":
        return cls(loss=grpo.loss, trained_steps=tuple(grpo.trained_steps(num_steps)), guidance=guidance,
                   block_size=grpo.block_size, block_fraction=grpo.block_fraction)

    def micro_batch_steps(self, rollout: Rollout, draw: torch.Generator | None) -> tuple[int, ...]:
        """The steps micro-batch training trains on `rollout`: its trained steps, or with blocks
        drawn (block_fraction < 1) a share of their blocks drawn from `draw`."""
        steps = self.steps_of(rollout)
        if self.block_fraction >= 1:
            return steps
        if draw is None:
            raise ValueError("grpo.block_fraction < 1 draws the trained blocks per micro-batch: pass a generator (draw=)")
        return draw_blocks(steps, self.block_size, self.block_fraction, draw)

    def check_strategy(self, strategy: GradientStrategy) -> None:
        """Drawn blocks hand the strategy trained steps with gaps between blocks: it must treat
        them block by block (`full`, or windows that divide grpo.block_size), never across a gap."""
        if self.block_fraction >= 1:
            return
        window = getattr(strategy, "window", None)
        if isinstance(strategy, FullStrategy) or (isinstance(window, int) and self.block_size % window == 0):
            return
        name = type(strategy).__name__
        raise ValueError(f"grpo.block_fraction < 1 trains blocks of grpo.block_size = {self.block_size} steps with gaps "
                         f"between them; strategy {name} " + (f"has strategy.window = {window}, which does not divide it"
                                                             if isinstance(window, int) else
                                                             "links steps across blocks (no strategy.window)"))

    def steps_of(self, rollout: Rollout) -> tuple[int, ...]:
        """The trained steps of `rollout`: its own (a moving SDE window) or the objective's."""
        return self.trained_steps if rollout.trained_steps is None else rollout.trained_steps

    def velocity_fn(self, policy: nn.Module, rollout: Rollout, idx: torch.Tensor) -> VelocityFn:
        """(x, s) -> guided v for micro-batch `idx` of the rollout's prompts."""
        return guided_velocity_fn(policy, index_cond(rollout.cond, idx), rollout.null_cond, self.guidance)

    def step_loss_fn(
        self,
        rollout: Rollout,
        idx: torch.Tensor,
        advantages: torch.Tensor,
        scale: float = 1.0,
        record: dict[int, StepStats] | None = None,
        on_policy: bool = False,
        steps: Sequence[int] | None = None,
    ) -> StepLossFn:
        """L_j(v) for trained step j of micro-batch `idx` (advantages: the whole batch's, (B,)),
        times `scale`. `record` receives each step's unscaled statistics, first value kept: a
        strategy's diagnostics re-evaluate steps it has already evaluated. on_policy: the
        parameters are those that sampled the rollout, so the ratio is 1 by definition and is
        taken against the loss's own forward (see GRPOLoss), not the rollout's log-probs.
        steps: the sampling steps that index j names (default: the rollout's trained steps)."""
        x, nxt = rollout.states[idx], rollout.next_states[idx]
        old = None if on_policy else rollout.log_probs[idx]
        ref = rollout.ref_means[idx] if rollout.ref_means is not None else None
        adv = advantages[idx]
        levels = rollout.noise_levels.tolist()
        steps = self.steps_of(rollout) if steps is None else tuple(steps)

        def loss(j: int, v: torch.Tensor) -> torch.Tensor:
            k = steps[j]
            value, stats = self.loss(
                v, x[:, k], nxt[:, k], levels[k], levels[k + 1], None if old is None else old[:, k], adv,
                noise_level=rollout.noise_level, s_first_below_one=rollout.s_first_below_one,
                reduction=rollout.log_prob_reduction, ref_mean=None if ref is None else ref[:, k],
            )
            if record is not None:
                record.setdefault(j, stats)
            return value * scale

        return loss

    def backward(
        self,
        strategy: GradientStrategy,
        policy: nn.Module,
        rollout: Rollout,
        advantages: torch.Tensor,
        idx: torch.Tensor,
        *,
        scale: float = 1.0,
        on_policy: bool = True,
        params: Sequence[nn.Parameter] | None = None,
        draw: torch.Generator | None = None,
    ) -> tuple[dict, list[StepStats]]:
        """The gradient phase of micro-batch `idx`: accumulate `strategy`'s gradient of
        scale * mean over trained steps of L_k into .grad. Returns the strategy's stats and
        the per-step loss statistics (one per trained step). draw: the generator of this
        micro-batch's blocks, when blocks are drawn (see `micro_batch_steps`)."""
        levels = rollout.noise_levels.tolist()
        steps = self.micro_batch_steps(rollout, draw)
        record: dict[int, StepStats] = {}
        stats = strategy(
            self.velocity_fn(policy, rollout, idx),
            [rollout.states[idx, k] for k in steps],
            [levels[k] for k in steps],
            self.step_loss_fn(rollout, idx, advantages, scale / len(steps), record, on_policy=on_policy, steps=steps),
            velocities=[rollout.velocities[idx, k] for k in steps],
            on_policy=on_policy,
            params=params,
        )
        return stats, [record[j] for j in sorted(record)]
