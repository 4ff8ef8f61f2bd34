"""Small frozen dataclasses passed between the stages of a GRPO step.

Data flows one way: prompts -> rollout (no grad) -> rewards -> advantages ->
gradient strategy -> optimizer step -> metrics. Each stage only sees these types.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

__all__ = ["Cond", "index_cond", "cat_cond", "expand_cond", "training_copy", "ODEPhase", "Rollout"]

# A prompt conditioning: a dict of batch-first tensors. The tiny DiT uses
# {"tokens": (B, L, D), "pooled": (B, D)}; diffusers adapters carry their own keys.
Cond = dict[str, torch.Tensor]


def index_cond(cond: Cond, index: torch.Tensor | slice) -> Cond:
    return {k: v[index] for k, v in cond.items()}


def cat_cond(*conds: Cond) -> Cond:
    return {k: torch.cat([c[k] for c in conds]) for k in conds[0]}


def expand_cond(cond: Cond, batch: int) -> Cond:
    """Broadcast a batch-1 conditioning (the null prompt) to `batch` rows."""
    return {k: v.expand(batch, *v.shape[1:]) for k, v in cond.items()}


def training_copy(record):
    """A dataclass `record` with its tensors (and dicts of tensors) cloned: copies made outside
    inference mode, so autograd may save them for backward."""
    def clone(value):
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, dict):
            return {k: v.clone() for k, v in value.items()}
        return value

    return replace(record, **{f.name: clone(getattr(record, f.name)) for f in fields(record)})


@dataclass(frozen=True)
class ODEPhase:
    """Sampling steps first .. end - 1 of the SDE grid, replaced by `steps` deterministic ODE steps
    of `solver` that cost `forwards` policy calls (a rollout records nothing at those steps)."""

    first: int
    end: int
    solver: str
    steps: int
    forwards: int


@dataclass(frozen=True)
class Rollout:
    """One SDE trajectory per sample, recorded for every sampling step k = 0..T-1."""

    states: torch.Tensor  # (B, T, *X) inputs x_k of each step
    next_states: torch.Tensor  # (B, T, *X) sampled x_{k+1}
    noise_levels: torch.Tensor  # (T + 1,) s_0 > ... > s_T = 0
    log_probs: torch.Tensor  # (B, T) log pi_old(x_{k+1} | x_k)
    velocities: torch.Tensor  # (B, T, *X) the (guided) velocities that were sampled with
    ref_means: torch.Tensor | None  # (B, T, *X) SDE means of the reference policy, when KL is on
    cond: Cond  # prompt conditioning, B rows
    null_cond: Cond  # null-prompt conditioning, 1 row
    final: torch.Tensor  # (B, *X) x_T, the generated sample
    noise_level: float  # the SDE's noise scale `a`: the loss re-evaluates the same transition
    log_prob_reduction: str  # "mean" | "sum" over pixels, as log_probs were reduced
    # sampling steps not sampled by the SDE (NaN in the per-step tensors): a head before the
    # first trained step and / or a tail after the last one, each an ODE of its own
    ode_phases: tuple[ODEPhase, ...] = ()
    forwards: int = 0  # policy calls the rollout made (each carries both CFG branches), reference calls left out
    trained_steps: tuple[int, ...] | None = None  # this rollout's own trained steps (a moving SDE window), else the objective's

    @property
    def num_steps(self) -> int:
        return self.states.shape[1]

    @property
    def s_first_below_one(self) -> float:
        """The noise level that stands in for s = 1 in the SDE's std (see sampling.sde.sde_std)."""
        return float(self.noise_levels[1])

    def for_training(self) -> "Rollout":
        """Copies made outside inference mode, so autograd may save them for backward."""
        return training_copy(self)
