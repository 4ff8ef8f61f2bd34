"""What a GRPO step leaves behind: the optimizer step (clip, skip a non-finite one, EMA) and the
counters a checkpoint keeps so that a resumed run continues exactly. A mixin of `GRPOModule`."""
from __future__ import annotations

import logging
import math

import torch

from jagg_lab.checkpointing import rng_state, set_rng_state

__all__ = ["StepUpdate"]

log = logging.getLogger(__name__)


class StepUpdate:
    """Expects on the module: `step_metrics` (MeanMetrics of the step's loss statistics), `grpo`,
    `ema`, `objective`, `strategy`, `sync_gradients()`, `trainable_parameters()`, and the counters
    `rollouts_done`, `skipped_steps`, `bad_steps_in_a_row`."""

    def step_means(self) -> dict[str, float]:
        """The optimizer step's loss statistics, averaged over every rank's micro-batches."""
        return {name: metric.compute().item() for name, metric in self.step_metrics.items()}

    def apply_update(self, opt, finite_rewards: bool) -> float:
        """Clip and step, unless the reward, loss or gradient is non-finite; returns the grad norm."""
        grad_norm, losses_finite = math.nan, True
        if finite_rewards:  # the same on every rank: rewards are gathered before this
            self.sync_gradients()
            max_norm = self.grpo.max_grad_norm or math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), max_norm).item()
            losses_finite = all(math.isfinite(value) for value in self.step_means().values())
        if finite_rewards and math.isfinite(grad_norm) and losses_finite:
            opt.step()
            if self.ema is not None:
                self.ema.update_parameters(self.policy)
            self.bad_steps_in_a_row = 0
        else:
            self.skipped_steps += 1
            self.bad_steps_in_a_row += 1
            log.warning("non-finite reward, loss or gradient at step %d: optimizer step skipped (%d in a row)",
                        self.global_step, self.bad_steps_in_a_row)
        opt.zero_grad(set_to_none=True)
        return grad_norm

    # ---- exact resume: counters that are not parameters ------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint.update(rollouts_done=self.rollouts_done, skipped_steps=self.skipped_steps,
                          strategy=self.strategy.state_dict(), rng=rng_state(), objective=self.objective.state_dict())

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.rollouts_done = checkpoint["rollouts_done"]
        self.skipped_steps = checkpoint["skipped_steps"]
        self.strategy.load_state_dict(checkpoint["strategy"])
        set_rng_state(checkpoint["rng"])
        self.objective.load_state_dict(checkpoint.get("objective", {}))
        # Checkpoints written while the KL reference was a submodule hold its weights: the reference
        # is the policy as the run started, rebuilt by the objective, so they are dropped.
        state = checkpoint.get("state_dict", {})
        for key in [k for k in state if k.startswith("ref_policy.")]:
            del state[key]
