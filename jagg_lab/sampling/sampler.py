"""The `sampler/` config group: how rollouts and evaluations are sampled."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jagg_lab.sampling.schedule import noise_schedule

__all__ = ["SDESampler"]


@dataclass(frozen=True)
class SDESampler:
    """Sampling settings shared by GRPO rollouts (SDE) and evaluation (ODE).

    num_steps: sampling steps T. shift: SD3 resolution shift (1 = none).
    noise_level: SDE noise scale `a`. guidance: classifier-free guidance scale (1 = off).
    log_prob_reduction: reduce per-pixel log-densities by "mean" (Flow-GRPO) or "sum".
    eval_num_steps: ODE steps for evaluation (defaults to num_steps).
    """

    num_steps: int = 10
    shift: float = 1.0
    noise_level: float = 0.7
    guidance: float = 1.0
    log_prob_reduction: str = "mean"
    eval_num_steps: int | None = None

    def __post_init__(self) -> None:
        if self.num_steps < 2:
            raise ValueError(f"sampler.num_steps must be >= 2, got {self.num_steps}")
        if self.shift <= 0:
            raise ValueError(f"sampler.shift must be > 0, got {self.shift}")
        if self.noise_level <= 0:
            raise ValueError(f"sampler.noise_level must be > 0, got {self.noise_level}")
        if self.guidance < 1:
            raise ValueError(f"sampler.guidance must be >= 1, got {self.guidance}")
        if self.log_prob_reduction not in ("mean", "sum"):
            raise ValueError(f"sampler.log_prob_reduction must be 'mean' or 'sum', got {self.log_prob_reduction!r}")

    def noise_levels(self) -> torch.Tensor:
        return noise_schedule(self.num_steps, self.shift)

    def eval_noise_levels(self) -> torch.Tensor:
        return noise_schedule(self.eval_num_steps or self.num_steps, self.shift)
