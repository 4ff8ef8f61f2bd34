"""The `sampler/` config group: how rollouts and evaluations are sampled."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jagg_lab.sampling.rollout import ODE_SOLVERS
from jagg_lab.sampling.schedule import SCHEDULES, sampling_levels

__all__ = ["SDESampler"]


@dataclass(frozen=True)
class SDESampler:
    """Sampling settings shared by GRPO rollouts (SDE) and evaluation (ODE).

    num_steps: sampling steps T. schedule: the noise grid, "uniform" (shift(linspace(1, 0, T + 1)))
    or "pipeline" (the sigmas the policy's diffusers pipeline samples on, from its scheduler
    config: shift, dynamic shifting); null = the policy's own, "pipeline" for a diffusers policy
    and "uniform" for the shapes DiT. Rollouts, the trained steps and evaluation all use it.
    shift: the uniform grid's SD3 resolution shift (1 = none); the pipeline grid takes its
    scheduler's shift and refuses any other value than 1 or that one.
    noise_level: SDE noise scale `a`. guidance: classifier-free guidance scale (1 = off).
    log_prob_reduction: reduce per-pixel log-densities by "mean" (Flow-GRPO) or "sum".
    eval_num_steps: ODE steps for evaluation (defaults to num_steps).
    tail_solver / tail_steps: sample the steps after the last trained step by a deterministic
    ODE (euler | heun | ab2) in tail_steps steps (null: as many as it replaces) instead of the SDE;
    the trained transitions and log-probs stay the same, only the final sample (and the reward)
    changes. head_solver / head_steps: likewise for the steps before the first trained step.
    null solver: the SDE, as by default. Evaluation keeps its own ODE (eval_num_steps, Euler).
    group_noise: the G samples of a prompt start from one initial noise (DanceGRPO's shared
    initialisation), so their rewards differ only by the SDE's noise, the policy's own actions;
    by default every sample draws its own.
    """

    num_steps: int = 10
    schedule: str | None = None
    shift: float = 1.0
    noise_level: float = 0.7
    guidance: float = 1.0
    log_prob_reduction: str = "mean"
    eval_num_steps: int | None = None
    tail_solver: str | None = None
    tail_steps: int | None = None
    head_solver: str | None = None
    head_steps: int | None = None
    group_noise: bool = False

    def __post_init__(self) -> None:
        if self.num_steps < 2:
            raise ValueError(f"sampler.num_steps must be >= 2, got {self.num_steps}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise ValueError(f"sampler.schedule must be one of {SCHEDULES} or null (the policy's own), got {self.schedule!r}")
        if self.shift <= 0:
            raise ValueError(f"sampler.shift must be > 0, got {self.shift}")
        if self.noise_level <= 0:
            raise ValueError(f"sampler.noise_level must be > 0, got {self.noise_level}")
        if self.guidance < 1:
            raise ValueError(f"sampler.guidance must be >= 1, got {self.guidance}")
        if self.log_prob_reduction not in ("mean", "sum"):
            raise ValueError(f"sampler.log_prob_reduction must be 'mean' or 'sum', got {self.log_prob_reduction!r}")
        for part in ("tail", "head"):
            solver, steps = getattr(self, f"{part}_solver"), getattr(self, f"{part}_steps")
            if solver is not None and solver not in ODE_SOLVERS:
                raise ValueError(f"sampler.{part}_solver must be one of {ODE_SOLVERS} or null, got {solver!r}")
            if steps is not None and solver is None:
                raise ValueError(f"sampler.{part}_steps = {steps} needs sampler.{part}_solver (null samples the {part} by the SDE)")
            if steps is not None and steps < 1:
                raise ValueError(f"sampler.{part}_steps must be >= 1 or null, got {steps}")

    def ode_phases(self, trained_steps: list[int]) -> dict:
        """The `sde_rollout` arguments for a run that trains `trained_steps`: the SDE span and the
        ODE head and tail ({} when both are the SDE). Raises ValueError naming the key of a head
        or tail that has no steps to replace."""
        if self.head_solver is None and self.tail_solver is None:
            return {}
        first, last = min(trained_steps), max(trained_steps)
        if self.tail_solver is not None and last == self.num_steps - 1:
            raise ValueError(f"sampler.tail_solver = {self.tail_solver!r}, but the trained steps reach the last of the "
                             f"{self.num_steps} sampling steps: there is no tail to sample by ODE")
        if self.head_solver is not None and first == 0:
            raise ValueError(f"sampler.head_solver = {self.head_solver!r}, but the first sampling step is trained: "
                             "there is no head to sample by ODE")
        return {
            "sde_span": (first, last),
            "head": None if self.head_solver is None else (self.head_solver, self.head_steps),
            "tail": None if self.tail_solver is None else (self.tail_solver, self.tail_steps),
        }

    def window_phases(self, window: list[int]) -> dict:
        """The `sde_rollout` arguments of a rollout whose SDE window is `window` (grpo.sde_window):
        the steps before and after it by ODE, with the head / tail solver (Euler when null)."""
        first, last = min(window), max(window)
        return {
            "sde_span": (first, last),
            "head": (self.head_solver or "euler", self.head_steps) if first > 0 else None,
            "tail": (self.tail_solver or "euler", self.tail_steps) if last < self.num_steps - 1 else None,
        }

    def noise_levels(self, policy: object = None) -> torch.Tensor:
        """The rollouts' grid for `policy` (its `pipeline_schedule`, if it has one), (num_steps + 1,);
        ValueError naming sampler.schedule or sampler.shift if they do not fit the policy."""
        return self._levels(self.num_steps, policy)

    def eval_noise_levels(self, policy: object = None) -> torch.Tensor:
        """The same grid at eval_num_steps (default num_steps), for ODE evaluation."""
        return self._levels(self.eval_num_steps or self.num_steps, policy)

    def _levels(self, num_steps: int, policy: object) -> torch.Tensor:
        return sampling_levels(num_steps, schedule=self.schedule, shift=self.shift, policy=policy)
