"""What forward-process objectives share: ODE rollouts, forward-noised training states, soft
copies of the weights, and the settings of the trajectory objective they make meaningless.

A forward-process objective (AWM, DiffusionNFT) never back-propagates through the sampling
trajectory. It samples the final images by a deterministic ODE, scores them, and trains on
each clean sample x0 with the flow-matching loss at forward-noised states
x_s = (1 - s) x0 + s eps (s on the rollout's own grid, a fresh eps per state), so the policy's
velocity target there is eps - x0 (the project's convention: dx/ds = v, s = 1 is noise).
The reward enters as a per-sample weight, computed from the GRPO group advantages.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import torch
from torch import nn

from jagg_lab.grpo.loss import StepStats
from jagg_lab.objectives.base import Objective
from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.policies.reference import reference_policy
from jagg_lab.sharding import FSDPStrategy
from jagg_lab.strategies import FullStrategy
from jagg_lab.sampling.rollout import ODE_SOLVERS, ode_integrate
from jagg_lab.types import Cond, index_cond, training_copy

__all__ = ["Samples", "SoftCopy", "ForwardObjective", "soft_update_rate", "noised", "trajectory_settings_used"]


@dataclass(frozen=True)
class Samples:
    """ODE rollouts and the forward-noised states a forward-process objective trains on.

    final: (B, *X) the clean samples x0. levels: (B, K) each sample's K training noise levels,
    noise: (B, K, *X) the eps of each. old_log_probs: (B, K) the behaviour policy's surrogate
    log-probs at those states (only when an objective takes off-policy optimizer steps)."""

    final: torch.Tensor
    cond: Cond
    null_cond: Cond
    noise_levels: torch.Tensor  # (T + 1,) the rollout grid
    levels: torch.Tensor
    noise: torch.Tensor
    forwards: int = 0
    old_log_probs: torch.Tensor | None = None

    def for_training(self) -> "Samples":
        """Copies made outside inference mode, so autograd may save them for backward."""
        return training_copy(self)


def noised(x0: torch.Tensor, noise: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x_s = (1 - s) x0 + s eps with s (B,): the forward process at noise level s."""
    s = s.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
    return (1 - s) * x0 + s * noise


def soft_update_rate(step: int, flat: int, rate: float, cap: float) -> float:
    """eta of a soft update after `step` optimizer steps: 0 for the first `flat` steps, then
    rate * (step - flat), at most cap (DiffusionNFT's and AWM's schedules)."""
    return 0.0 if step < flat else min(rate * (step - flat), cap)


class SoftCopy:
    """A detached copy of the policy's trainable weights (a LoRA policy: its adapters only), moved
    toward the policy by theta_c <- eta theta_c + (1 - eta) theta. `swapped` runs the policy with the
    copy's weights in place (no second model in memory); its outputs must not need gradients."""

    def __init__(self, params: Sequence[nn.Parameter]):
        self.tensors = [p.detach().clone() for p in params]

    def follow(self, params: Sequence[nn.Parameter]) -> None:
        """Keep the copy where the weights are (the module moves to its device after attach)."""
        if any(t.device != p.device or t.dtype != p.dtype for t, p in zip(self.tensors, params)):
            self.tensors = [t.to(p.device, p.dtype) for t, p in zip(self.tensors, params, strict=True)]

    @torch.no_grad()
    def update(self, params: Sequence[nn.Parameter], eta: float) -> None:
        self.follow(params)
        for copy, p in zip(self.tensors, params, strict=True):
            copy.mul_(eta).add_(p.detach(), alpha=1 - eta)

    @contextmanager
    def swapped(self, params: Sequence[nn.Parameter]) -> Iterator[None]:
        self.follow(params)
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
            for copy, p in zip(self.tensors, params, strict=True):
                p.copy_(copy)
        try:
            yield
        finally:
            with torch.no_grad():
                for keep, p in zip(saved, params):
                    p.copy_(keep)

    def state_dict(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.tensors]

    def load_state_dict(self, tensors: list[torch.Tensor]) -> None:
        if len(tensors) != len(self.tensors) or any(a.shape != b.shape for a, b in zip(tensors, self.tensors)):
            raise ValueError("the checkpoint's soft copy of the weights does not match the policy's trainable parameters")
        self.tensors = [t.detach().clone().to(own.device, own.dtype) for t, own in zip(tensors, self.tensors)]


# The trajectory objective's settings (conf/grpo, conf/sampler) that a forward-process objective has
# no use for: each key, its default, and why. A changed value is refused, naming the key.
_TRAJECTORY_SETTINGS = {
    "grpo.clip_range": (1e-4, "its loss has no GRPO ratio to clip (AWM: objective.clip_range)"),
    "grpo.beta": (0.0, "its KL term is objective.kl_weight"),
    "grpo.train_fraction": (0.6, "it trains no sampling step"),
    "grpo.train_steps": (None, "it trains no sampling step"),
    "grpo.sde_window": (None, "it trains no sampling step"),
    "grpo.block_size": (None, "it trains no sampling step"),
    "grpo.block_fraction": (1.0, "it trains no sampling step"),
    "sampler.tail_solver": (None, "its rollouts are ODE throughout"),
    "sampler.head_solver": (None, "its rollouts are ODE throughout"),
    "sampler.group_noise": (False, "an ODE rollout from one noise gives every sample of a group the same image, "
                                   "hence equal rewards and no signal"),
}


def trajectory_settings_used(cfg, objective_name: str) -> list[str]:
    """Why the config asks a forward-process objective for what it cannot do: one line per
    trajectory-only key set away from its default, a gradient strategy other than `full`, FSDP."""
    problems = []
    for key, (default, why) in _TRAJECTORY_SETTINGS.items():
        group, name = key.split(".")
        value = cfg.get(group, {}).get(name, default)
        if value != default:
            problems.append(f"{key}={value}: not used by objective={objective_name}: {why}")
    trainer_strategy = cfg.get("trainer", {}).get("strategy")
    if isinstance(trainer_strategy, Mapping) and _is_subclass(trainer_strategy.get("_target_"), FSDPStrategy):
        problems.append(f"trainer=fsdp: objective={objective_name}'s soft copies of the weights are not sharded; "
                        "train it with trainer=cpu, ddp or ddp_cpu")
    target = cfg.get("strategy", {}).get("_target_")
    if target and not _is_subclass(target, FullStrategy):
        problems.append(f"strategy={str(target).rsplit('.', 1)[-1]}: a gradient strategy decides how a trajectory's "
                        f"signals reach the parameters; objective={objective_name} has no trajectory (leave strategy=full)")
    return problems


def _is_subclass(target: str | None, kind: type) -> bool:
    """Whether the class a config's `_target_` names is `kind` or derives from it."""
    from hydra.utils import get_class

    try:
        return target is not None and issubclass(get_class(str(target)), kind)
    except Exception:  # not a class (a function, a bad path): the config's own checks name it
        return False


class ForwardObjective(Objective, ABC):
    """The shared machinery of a forward-process objective; subclasses give the per-sample
    weights (`sample_weights`), the training noise levels (`draw_levels`) and the loss.

    solver: the ODE solver of the rollouts (euler | heun | ab2) on the sampler's grid, at the
    sampler's guidance; the loss re-evaluates the same guided velocity (guidance 1: the
    conditional branch alone, the papers' CFG-free setting). kl_weight: weight of
    mean ||v_theta - v_ref||^2 to the starting policy (0 = off, no reference forwards)."""

    name = "forward"

    def __init__(self, solver: str = "euler", kl_weight: float = 0.0):
        if solver not in ODE_SOLVERS:
            raise ValueError(f"objective.solver must be one of {ODE_SOLVERS}, got {solver!r}")
        if kl_weight < 0:
            raise ValueError(f"objective.kl_weight must be >= 0, got {kl_weight}")
        super().__init__()
        self.solver, self.kl_weight = solver, kl_weight
        self.guidance = 1.0

    # ---- set-up ----------------------------------------------------------------------
    def check(self, cfg, grpo, sampler, strategy) -> list[str]:
        """The trajectory settings it has no use for (`trajectory_settings_used`), then its own."""
        return trajectory_settings_used(cfg, self.name) + self.check_settings(cfg)

    def check_settings(self, cfg) -> list[str]:
        """Why the training config asks this objective for what it cannot do, one line each (none by default)."""
        return []

    def setup(self, policy, params, sampler, grpo, strategy, seed=0) -> None:
        """Its KL reference (the policy as it starts), the sampler's CFG scale; `attach`."""
        super().setup(policy, params, sampler, grpo, strategy, seed)
        self.attach(policy, params, sampler.guidance, reference_policy(policy) if self.needs_reference else None)

    def attach(self, policy: nn.Module, params: Sequence[nn.Parameter], guidance: float, ref_policy=None) -> None:
        """Bind to the run's policy: its trainable parameters, the CFG scale, the KL reference."""
        self.guidance = guidance
        self.ref_policy = ref_policy

    @property
    def needs_reference(self) -> bool:
        return self.kl_weight > 0

    def sampling_weights(self, params: Sequence[nn.Parameter]):
        """The context the rollouts are sampled under (default: the current weights)."""
        return _nothing()

    # ---- the rollout -----------------------------------------------------------------
    @torch.inference_mode()
    def rollout(self, policy: nn.Module, params: Sequence[nn.Parameter], cond: Cond, null_cond: Cond,
                initial_noise: torch.Tensor, noise_levels: torch.Tensor, generator: torch.Generator,
                shard: tuple[int, int] = (0, 1)) -> Samples:
        """ODE samples from `initial_noise` (this rank's rows), then each sample's training levels
        and noise, drawn from `generator` for the whole global batch (every rank draws the same)."""
        with self.sampling_weights(params):
            final, calls = ode_integrate(guided_velocity_fn(policy, cond, null_cond, self.guidance), initial_noise,
                                         noise_levels.tolist(), self.solver)
        rank, world = shard
        rows = initial_noise.shape[0]
        levels = self.draw_levels(world * rows, noise_levels, generator)[rank * rows:(rank + 1) * rows]
        eps = torch.randn((world * rows, levels.shape[1], *initial_noise.shape[1:]), generator=generator,
                          dtype=initial_noise.dtype)[rank * rows:(rank + 1) * rows]
        return Samples(final=final, cond=cond, null_cond=null_cond, noise_levels=noise_levels,
                       levels=levels.to(final.device, final.dtype), noise=eps.to(final.device), forwards=calls)

    def sample(self, policy, params, cond, null_cond, noise, generator, shard=(0, 1), index=0, sampler=None) -> Samples:
        """`rollout` on the sampler's grid, then what it needs from the sampling policy (`prepare`)."""
        sampler = sampler or self.sampler
        samples = self.rollout(policy, params, cond, null_cond, noise, sampler.noise_levels(policy).to(noise.device),
                               generator, shard)
        return self.prepare(policy, samples.for_training(), off_policy=self.grpo.optimizer_steps_per_rollout > 1,
                            micro_batch_size=self.grpo.micro_batch_size)

    def weights(self, advantages: torch.Tensor) -> torch.Tensor:
        return self.sample_weights(advantages, self.grpo.adv_clip_max)

    @abstractmethod
    def draw_levels(self, batch: int, noise_levels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(batch, K) training noise levels, taken from the rollout grid `noise_levels` (T + 1,)."""

    def prepare(self, policy: nn.Module, samples: Samples, off_policy: bool, micro_batch_size: int) -> Samples:
        """What the objective needs from the sampling policy before any update (default: nothing)."""
        return samples

    # ---- the gradient phase ----------------------------------------------------------
    @abstractmethod
    def sample_weights(self, advantages: torch.Tensor, clip_max: float) -> torch.Tensor:
        """(B,) the per-sample reward weight from the group advantages (clipped to +-clip_max)."""

    def velocity(self, policy, samples: Samples, idx: torch.Tensor, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return guided_velocity_fn(policy, index_cond(samples.cond, idx), samples.null_cond, self.guidance)(x, s)

    def reference_velocity(self, samples: Samples, idx: torch.Tensor, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor | None:
        if not self.needs_reference:
            return None
        with torch.no_grad():
            return self.velocity(self.ref_policy, samples, idx, x, s)

    @abstractmethod
    def state_loss(self, policy: nn.Module, params: Sequence[nn.Parameter], samples: Samples, idx: torch.Tensor,
                   j: int, weights: torch.Tensor, on_policy: bool) -> tuple[torch.Tensor, StepStats, int]:
        """The loss of the j-th training state of micro-batch `idx` (a mean over its samples),
        its statistics, and the policy forwards made without grad (frozen copies, reference)."""

    def backward(self, policy: nn.Module, params: Sequence[nn.Parameter], samples: Samples, weights: torch.Tensor,
                 idx: torch.Tensor, scale: float = 1.0, on_policy: bool = True, shard: tuple[int, int] = (0, 1),
                 index: int = 0) -> tuple[dict, list[StepStats]]:
        """Accumulate scale * (mean over the K training states of the loss) into .grad, one
        backward per state (each its own graph: no graph outlives a swap of weights)."""
        per_state = []
        nograd = 0
        num = samples.levels.shape[1]
        for j in range(num):
            loss, stats, calls = self.state_loss(policy, params, samples, idx, j, weights, on_policy)
            (loss * (scale / num)).backward()
            per_state.append(stats)
            nograd += calls
        counts = {"backward_passes": num, "backward_items": num, "grad_forwards": num, "nograd_forwards": nograd,
                  "loss": sum(s.loss.item() for s in per_state) / num}
        return counts, per_state


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def stats_of(loss: torch.Tensor, policy_loss: torch.Tensor, kl: torch.Tensor, ratio: torch.Tensor | None = None,
             clip_frac: torch.Tensor | None = None) -> StepStats:
    """A forward-process state's statistics in the columns the trajectory objective logs."""
    zero = torch.zeros((), device=loss.device)
    with torch.no_grad():
        return StepStats(loss=loss.detach(), policy_loss=policy_loss.detach(), kl=kl.detach(),
                         clip_frac=zero if clip_frac is None else clip_frac,
                         approx_kl=zero if ratio is None else (0.5 * ratio.log() ** 2).mean(),
                         ratio_mean=torch.ones((), device=loss.device) if ratio is None else ratio.mean())


def grid_levels(noise_levels: torch.Tensor) -> torch.Tensor:
    """The rollout grid's levels that start a sampling step (s_0 .. s_{T-1}, all > 0)."""
    return noise_levels[:-1].detach().cpu().double()


def check_positive_int(value: int, key: str) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")


def check_schedule(**values: float) -> None:
    """A soft update's schedule: steps and rates >= 0 (`*_flat`, `*_rate`), caps in [0, 1) (`*_cap`)."""
    for key, value in values.items():
        ok = 0 <= value < 1 if key.endswith("_cap") else value >= 0
        if not ok:
            raise ValueError(f"objective.{key} must be {'in [0, 1)' if key.endswith('_cap') else '>= 0'}, got {value}")


def check_fraction(value: float, key: str) -> None:
    if not 0 < value <= 1 or math.isnan(value):
        raise ValueError(f"{key} must be in (0, 1], got {value}")
