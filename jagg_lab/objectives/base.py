"""The objective seam: what a GRPO step optimises, as the stages `GRPOModule.training_step` calls.

    setup        bind to the run (policy, sampler, grpo settings, gradient strategy, seed); build
                 the frozen copies it keeps (KL reference, soft copies), none of them a submodule
    sample       the rollout batch of this rank's rows (no grad), ready for the gradient phase
    weights      per-sample reward weights from the group advantages
    backward     accumulate one micro-batch's gradient into .grad; its loss statistics
    after_rollout  once a rollout's optimizer steps are done (soft updates)
    state_dict   what a checkpoint keeps to resume exactly

A new objective subclasses `Objective`, implements `sample` and `backward` (and what else it
needs), and is selected by a `conf/objective/<name>.yaml` whose `_target_` names the class; the
module never asks which kind it holds. `check` refuses the settings it cannot use before any work.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch
from torch import nn

from jagg_lab.grpo.config import GRPOConfig
from jagg_lab.grpo.loss import StepStats
from jagg_lab.sampling import SDESampler
from jagg_lab.strategies import GradientStrategy
from jagg_lab.types import Cond

__all__ = ["Objective"]


class Objective(ABC):
    """What a GRPO step optimises (see the module docstring for the stages).

    trajectory: whether it trains the sampled SDE trajectory through a gradient strategy (and so
    uses `strategy` and the trajectory settings of `grpo`). ref_policy: the frozen KL reference
    (None when no KL term), kept here, not on the Lightning module, so that it is neither a
    trainable nor a trainer-visible submodule."""

    name = "objective"
    trajectory = False

    def __init__(self) -> None:
        self.ref_policy = None

    # ---- set-up ----------------------------------------------------------------------
    def check(self, cfg, grpo: GRPOConfig, sampler: SDESampler, strategy: GradientStrategy) -> list[str]:
        """Why the training config asks this objective for what it cannot do, one line each,
        checked before any work (none by default)."""
        return []

    def setup(self, policy: nn.Module, params: Sequence[nn.Parameter], sampler: SDESampler, grpo: GRPOConfig,
              strategy: GradientStrategy, seed: int = 0) -> None:
        """Bind to the run; called once by the module, before training."""
        self.sampler, self.grpo, self.strategy, self.seed = sampler, grpo, strategy, seed

    def frozen_modules(self) -> list[nn.Module]:
        """The frozen copies it keeps that are modules: the Lightning module moves and casts them
        with itself (they are not its submodules)."""
        return [self.ref_policy] if isinstance(self.ref_policy, nn.Module) else []

    def compile(self, policy: nn.Module, on: bool) -> None:
        """Route the rollout's policy calls through torch.compile (default: not supported, eager)."""

    # ---- the stages ------------------------------------------------------------------
    @abstractmethod
    def sample(self, policy: nn.Module, params: Sequence[nn.Parameter], cond: Cond, null_cond: Cond,
               noise: torch.Tensor, generator: torch.Generator, shard: tuple[int, int] = (0, 1), index: int = 0,
               sampler: SDESampler | None = None):
        """The rollout batch of this rank's rows (`noise`, `cond`), made without grad, ready for
        `backward`. generator: shared by all ranks; index: the run's rollout number; sampler: the
        run's by default (a benchmark may pass another setting of it)."""

    def weights(self, advantages: torch.Tensor) -> torch.Tensor:
        """(B,) per-sample reward weights from the group advantages (default: the advantages)."""
        return advantages

    @abstractmethod
    def backward(self, policy: nn.Module, params: Sequence[nn.Parameter], batch, weights: torch.Tensor,
                 idx: torch.Tensor, scale: float = 1.0, on_policy: bool = True, shard: tuple[int, int] = (0, 1),
                 index: int = 0) -> tuple[dict, list[StepStats]]:
        """Accumulate scale x micro-batch `idx`'s loss gradient into .grad. Returns the work done
        (backward passes, items, forwards; see `strategies.core.combine_stats`) and the loss
        statistics of each term it averaged."""

    def after_rollout(self, params: Sequence[nn.Parameter], optimizer_steps: int) -> None:
        """Called once a rollout's optimizer steps are done (default: nothing)."""

    def reference_calls(self, batch) -> int:
        """KL-reference policy calls its rollout makes (counted in the rollout's time)."""
        return 0

    # ---- exact resume ----------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
