"""Stateless noise-level schedules for rectified flow (s = 1 noise, s = 0 data).

Two grids of T steps (T + 1 levels from 1 down to 0):

* uniform: shift(linspace(1, 0, T + 1)), the project's own (the shapes DiT was trained for it).
* pipeline: the sigmas a diffusers pipeline samples on, computed as diffusers'
  `FlowMatchEulerDiscreteScheduler.set_timesteps` does when `StableDiffusion3Pipeline` or
  `FluxPipeline` calls it, then 0 appended. SD3 spaces T points linearly over the scheduler's
  training sigmas, from 1 to its smallest (itself shifted), then shifts them again; FLUX spaces
  linspace(1, 1/T, T) and, with dynamic shifting, shifts by mu, a linear function of the image's
  token count. At T = 10 and shift 3 the last non-zero level is 0.0089 there against 0.25 on the
  uniform grid: the pretrained model is sampled, and Flow-GRPO trains it, on the former.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

__all__ = [
    "SCHEDULES", "SPACINGS", "PipelineSchedule", "calculate_shift", "noise_schedule", "sampling_levels",
    "shift_noise_levels", "time_shift",
]

SCHEDULES = ("uniform", "pipeline")
# How the pipeline spaces its T sigmas before shifting them: "sd3" (StableDiffusion3Pipeline: the
# scheduler's own linspace over its training sigmas) or "flux" (FluxPipeline: linspace(1, 1/T, T)).
SPACINGS = ("sd3", "flux")
# Scheduler options that change the grid in ways not reproduced here; a pipeline using one is refused.
_UNSUPPORTED = ("shift_terminal", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                "stochastic_sampling")


def shift_noise_levels(s: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3's resolution shift s' = shift * s / (1 + (shift - 1) * s); shift 1 is identity."""
    return shift * s / (1 + (shift - 1) * s)


def noise_schedule(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """The uniform grid: s_0 = 1 > s_1 > ... > s_T = 0, linear in s then shifted. Shape (T + 1,)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return shift_noise_levels(s, shift).float()


def calculate_shift(image_seq_len: int, base_seq_len: int, max_seq_len: int, base_shift: float, max_shift: float) -> float:
    """FLUX's mu: linear in the image's token count, base_shift at base_seq_len, max_shift at max_seq_len."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + base_shift - slope * base_seq_len


def time_shift(s: torch.Tensor, mu: float, kind: str = "exponential") -> torch.Tensor:
    """Dynamic shifting: e^mu / (e^mu + 1/s - 1) ("exponential") or mu / (mu + 1/s - 1) ("linear")."""
    # A tensor numerator: `float / tensor` would multiply by a reciprocal, one more rounding than the scheduler's.
    if kind == "exponential":
        numerator = torch.tensor(math.exp(mu), dtype=s.dtype)
    elif kind == "linear":
        numerator = torch.tensor(mu, dtype=s.dtype)
    else:
        raise ValueError(f"time_shift_type must be 'exponential' or 'linear', got {kind!r}")
    return numerator / (numerator + (1 / s - 1))


@dataclass(frozen=True)
class PipelineSchedule:
    """The sigma grid of one diffusers flow-matching pipeline at one image size.

    spacing: "sd3" or "flux" (see SPACINGS). The other fields are the scheduler config's keys of
    the same names; image_seq_len is the transformer's image token count (what the pipeline feeds
    `calculate_shift`), used only with dynamic shifting.
    """

    spacing: str
    image_seq_len: int
    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    time_shift_type: str = "exponential"
    num_train_timesteps: int = 1000

    def __post_init__(self) -> None:
        if self.spacing not in SPACINGS:
            raise ValueError(f"pipeline spacing must be one of {SPACINGS}, got {self.spacing!r}")
        if self.shift <= 0:
            raise ValueError(f"the scheduler's shift must be > 0, got {self.shift}")
        if self.time_shift_type not in ("exponential", "linear"):
            raise ValueError(f"the scheduler's time_shift_type must be 'exponential' or 'linear', got {self.time_shift_type!r}")

    @classmethod
    def from_scheduler_config(cls, config: Mapping[str, Any], spacing: str, image_seq_len: int) -> "PipelineSchedule":
        """From a `FlowMatchEulerDiscreteScheduler` config (a pipeline's `scheduler/scheduler_config.json`);
        ValueError naming the option if the scheduler is another class or uses a grid option
        (karras / exponential / beta sigmas, shift_terminal, ...) that is not reproduced here."""
        name = config.get("_class_name", "FlowMatchEulerDiscreteScheduler")
        if name != "FlowMatchEulerDiscreteScheduler":
            raise ValueError(f"sampler.schedule=pipeline reproduces FlowMatchEulerDiscreteScheduler only; this pipeline's "
                             f"scheduler is {name}: use sampler.schedule=uniform")
        used = [key for key in _UNSUPPORTED if config.get(key)]
        if used:
            raise ValueError(f"sampler.schedule=pipeline: the pipeline's scheduler sets {used}, which this project does not "
                             "reproduce: use sampler.schedule=uniform")
        fields = ("shift", "use_dynamic_shifting", "base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len",
                  "time_shift_type", "num_train_timesteps")
        return cls(spacing=spacing, image_seq_len=image_seq_len,
                   **{k: config[k] for k in fields if config.get(k) is not None})

    @property
    def mu(self) -> float:
        return calculate_shift(self.image_seq_len, self.base_image_seq_len, self.max_image_seq_len, self.base_shift,
                               self.max_shift)

    def noise_levels(self, num_steps: int) -> torch.Tensor:
        """The pipeline's sigmas for `num_steps` steps, then 0: (T + 1,) float32, from 1 down to 0."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        if self.spacing == "sd3":
            # The scheduler's training sigmas run from 1 down to 1 / num_train_timesteps, shifted
            # (in float32) unless shifting is dynamic; set_timesteps spaces T points between the
            # first and the last of them (in float64) and shifts those.
            lowest = torch.tensor(1.0 / self.num_train_timesteps, dtype=torch.float32)
            if not self.use_dynamic_shifting:
                lowest = shift_noise_levels(lowest, self.shift)
            s = torch.linspace(1.0, lowest.item(), num_steps, dtype=torch.float64)
        else:
            s = torch.linspace(1.0, 1.0 / num_steps, num_steps, dtype=torch.float64).float()  # FluxPipeline's
        if self.use_dynamic_shifting:
            s = time_shift(s, self.mu, self.time_shift_type)
        else:
            s = shift_noise_levels(s, self.shift)
        return torch.cat([s.float(), torch.zeros(1)])


def sampling_levels(num_steps: int, *, schedule: str | None, shift: float, policy: object = None,
                    key: str = "sampler") -> torch.Tensor:
    """The grid `policy` is sampled (and trained) on, (num_steps + 1,).

    schedule: "uniform", "pipeline", or None for the policy's own: "pipeline" when it comes from a
    diffusers pipeline (it then has a `pipeline_schedule`, a PipelineSchedule), else "uniform".
    shift: the uniform grid's shift. The pipeline grid takes its scheduler's shift; `shift` must
    then be 1 (the default) or agree with it. ValueError naming `key`.schedule or `key`.shift otherwise.
    """
    if schedule is not None and schedule not in SCHEDULES:
        raise ValueError(f"{key}.schedule must be one of {SCHEDULES} or null (the policy's own), got {schedule!r}")
    pipeline = None if schedule == "uniform" else getattr(policy, "pipeline_schedule", None)
    schedule = schedule or ("pipeline" if pipeline is not None else "uniform")
    if schedule == "uniform":
        return noise_schedule(num_steps, shift)
    if pipeline is None:
        raise ValueError(f"{key}.schedule=pipeline, but this policy does not come from a diffusers pipeline (no scheduler "
                         f"to take the grid from): use {key}.schedule=uniform or null")
    if shift != 1.0:
        if pipeline.use_dynamic_shifting:
            raise ValueError(f"{key}.shift={shift}, but the pipeline grid shifts dynamically with the image size (mu = "
                             f"{pipeline.mu:.4f}); leave {key}.shift at 1 or use {key}.schedule=uniform")
        if not math.isclose(shift, pipeline.shift):
            raise ValueError(f"{key}.shift={shift}, but the pipeline's scheduler shifts by {pipeline.shift}; leave "
                             f"{key}.shift at 1 (the pipeline's) or use {key}.schedule=uniform for another shift")
    return pipeline.noise_levels(num_steps)
