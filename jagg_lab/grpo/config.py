"""The `grpo/` config group: the GRPO objective and how a rollout batch is optimised."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from jagg_lab.grpo.loss import GRPOLoss

__all__ = ["GRPOConfig", "SDE_WINDOW_SCHEDULES", "draw_blocks"]

SDE_WINDOW_SCHEDULES = ("random", "sliding")


def draw_blocks(steps: Sequence[int], block_size: int, fraction: float, generator: torch.Generator) -> tuple[int, ...]:
    """A random max(1, int(n_blocks * fraction)) of the consecutive blocks of `block_size` steps
    of `steps` (a shorter leftover block last), their steps in sampling order."""
    blocks = [tuple(steps[i:i + block_size]) for i in range(0, len(steps), block_size)]
    chosen = torch.randperm(len(blocks), generator=generator)[:max(1, int(len(blocks) * fraction))]
    return tuple(k for b in sorted(chosen.tolist()) for k in blocks[b])


@dataclass(frozen=True)
class GRPOConfig:
    """clip_range, beta: see GRPOLoss. adv_std: "group" or "global" advantage scaling;
    adv_clip_max: advantage clip. train_fraction: share of sampling steps trained, taken
    from the high-noise end (the low-noise steps carry little reward signal); train_steps:
    explicit step indices instead. optimizer_steps_per_rollout: the rollout batch is
    shuffled and split into this many optimizer steps (the first is on-policy).
    micro_batch_size: samples per backward micro-batch (gradient accumulation inside a step).
    max_grad_norm: gradient clipping (0 = off). ema_decay: EMA of the policy (null = off).
    shuffle_advantages: a control run: advantages are permuted across the batch, keeping
    their distribution and every other cost but cutting their link to the samples; a gain
    claimed for a real run should beat it.

    sde_window: a moving window of this many consecutive sampling steps is sampled by the SDE
    and trained, each rollout's own; the steps before and after it are sampled by ODE (the
    sampler's head / tail solver, Euler when null). It replaces train_fraction / train_steps.
    sde_window_schedule: "random" (the window's first step uniform over sde_window_range, a fresh draw
    per rollout: Flow-GRPO-Fast) or "sliding" (it starts at sde_window_range[0] and moves by
    sde_window_stride steps every sde_window_shift_every rollouts, back to the start past the range's
    end: MixGRPO). sde_window_range: [lo, hi), the steps the window may cover (null: all).
    """

    clip_range: float = 1e-4
    beta: float = 0.0
    adv_std: str = "global"
    adv_clip_max: float = 5.0
    train_fraction: float = 0.6
    train_steps: tuple[int, ...] | None = None
    optimizer_steps_per_rollout: int = 1
    micro_batch_size: int = 32
    max_grad_norm: float = 1.0
    ema_decay: float | None = None
    shuffle_advantages: bool = False
    sde_window: int | None = None
    sde_window_schedule: str = "random"
    sde_window_range: tuple[int, int] | None = None
    sde_window_shift_every: int = 25
    sde_window_stride: int = 1
    block_size: int | None = None
    block_fraction: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.train_fraction <= 1:
            raise ValueError(f"grpo.train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.adv_std not in ("group", "global"):
            raise ValueError(f"grpo.adv_std must be 'group' or 'global', got {self.adv_std!r}")
        if self.adv_clip_max <= 0:
            raise ValueError(f"grpo.adv_clip_max must be > 0, got {self.adv_clip_max}")
        if self.optimizer_steps_per_rollout < 1:
            raise ValueError(f"grpo.optimizer_steps_per_rollout must be >= 1, got {self.optimizer_steps_per_rollout}")
        if self.micro_batch_size < 1:
            raise ValueError(f"grpo.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.max_grad_norm < 0:
            raise ValueError(f"grpo.max_grad_norm must be >= 0, got {self.max_grad_norm}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ValueError(f"grpo.ema_decay must be in (0, 1) or null, got {self.ema_decay}")
        if self.train_steps is not None:
            object.__setattr__(self, "train_steps", tuple(int(k) for k in self.train_steps))
            if not self.train_steps or sorted(set(self.train_steps)) != list(self.train_steps):
                raise ValueError(f"grpo.train_steps must be non-empty, increasing and unique, got {list(self.train_steps)}")
        GRPOLoss(self.clip_range, self.beta)  # validates clip_range and beta
        if self.sde_window is not None:
            if self.sde_window < 1:
                raise ValueError(f"grpo.sde_window must be >= 1 or null, got {self.sde_window}")
            if self.train_steps is not None:
                raise ValueError("grpo.sde_window picks the trained steps per rollout; leave grpo.train_steps null")
        elif self.sde_window_range is not None or self.sde_window_schedule != "random":
            raise ValueError("grpo.sde_window_range and grpo.sde_window_schedule shape a moving SDE window: set grpo.sde_window too")
        if self.sde_window_schedule not in SDE_WINDOW_SCHEDULES:
            raise ValueError(f"grpo.sde_window_schedule must be one of {SDE_WINDOW_SCHEDULES}, got {self.sde_window_schedule!r}")
        if self.sde_window_shift_every < 1 or self.sde_window_stride < 1:
            raise ValueError(f"grpo.sde_window_shift_every and grpo.sde_window_stride must be >= 1, "
                             f"got {self.sde_window_shift_every} and {self.sde_window_stride}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"grpo.block_size must be >= 1 or null, got {self.block_size}")
        if not 0 < self.block_fraction <= 1:
            raise ValueError(f"grpo.block_fraction must be in (0, 1], got {self.block_fraction}")
        if self.block_fraction < 1 and self.block_size is None:
            raise ValueError("grpo.block_fraction trains a share of the blocks of grpo.block_size steps: set grpo.block_size too")
        if self.block_fraction < 1 and self.sde_window is not None:
            raise ValueError("grpo.block_fraction draws blocks of the fixed trained steps; a moving SDE window "
                             "(grpo.sde_window) picks its own: use one of the two")
        if self.sde_window_range is not None:
            object.__setattr__(self, "sde_window_range", tuple(int(k) for k in self.sde_window_range))
            if len(self.sde_window_range) != 2 or not 0 <= self.sde_window_range[0] < self.sde_window_range[1]:
                raise ValueError(f"grpo.sde_window_range must be [lo, hi) with 0 <= lo < hi, got {list(self.sde_window_range)}")

    @property
    def loss(self) -> GRPOLoss:
        return GRPOLoss(clip_range=self.clip_range, beta=self.beta)

    def trained_steps(self, num_steps: int) -> list[int]:
        """Indices of the sampling steps that receive gradients, in sampling order."""
        if self.sde_window is not None:
            return self.sde_window_steps(num_steps, 0, None)
        if self.train_steps is not None:
            bad = [k for k in self.train_steps if not 0 <= k < num_steps]
            if bad:
                raise ValueError(f"grpo.train_steps {bad} outside the {num_steps} sampling steps")
            return list(self.train_steps)
        return list(range(max(1, math.ceil(self.train_fraction * num_steps - 1e-9))))

    @property
    def draws_blocks(self) -> bool:
        """Whether each micro-batch trains its own random share of the trained steps' blocks."""
        return self.block_fraction < 1

    def draw_blocks(self, steps: Sequence[int], generator: torch.Generator) -> tuple[int, ...]:
        """The trained steps of one micro-batch: a random max(1, int(n_blocks * block_fraction)) of
        the consecutive blocks of block_size steps of `steps` (all of them when nothing is drawn),
        in sampling order."""
        return draw_blocks(steps, self.block_size, self.block_fraction, generator) if self.draws_blocks else tuple(steps)

    def sde_window_bounds(self, num_steps: int) -> tuple[int, int]:
        """The first and last start of the SDE window (grpo.sde_window) in `num_steps` steps."""
        lo, hi = self.sde_window_range if self.sde_window_range is not None else (0, num_steps)
        if hi > num_steps or hi - lo < self.sde_window:
            raise ValueError(f"grpo.sde_window_range {[lo, hi]} does not hold a window of grpo.sde_window = "
                             f"{self.sde_window} steps within the {num_steps} sampling steps")
        return lo, hi - self.sde_window

    def sde_window_steps(self, num_steps: int, rollout: int, generator: "torch.Generator | None") -> list[int]:
        """The trained steps of rollout number `rollout` under grpo.sde_window: drawn from
        `generator` ("random"; None: the first start) or by the sliding schedule."""
        first, last = self.sde_window_bounds(num_steps)
        if self.sde_window_schedule == "random":
            start = first if generator is None else first + int(torch.randint(last - first + 1, (1,), generator=generator))
        else:
            start = first + (self.sde_window_stride * (rollout // self.sde_window_shift_every)) % (last - first + 1)
        return list(range(start, start + self.sde_window))

    def check_batch(self, samples_per_step: int) -> None:
        """The rollout batch must split into whole optimizer steps and whole micro-batches."""
        if samples_per_step % self.optimizer_steps_per_rollout:
            raise ValueError(
                f"data.prompts_per_step * data.group_size = {samples_per_step} samples do not split into "
                f"grpo.optimizer_steps_per_rollout = {self.optimizer_steps_per_rollout} equal optimizer steps"
            )
        per_opt = samples_per_step // self.optimizer_steps_per_rollout
        if per_opt % self.micro_batch_size:
            raise ValueError(
                f"{per_opt} samples per optimizer step do not split into whole micro-batches of "
                f"grpo.micro_batch_size = {self.micro_batch_size}"
            )
