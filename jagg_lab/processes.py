"""How the module works across processes (Lightning DDP, or FSDP through `jagg_lab.sharding`).

Every rank sees the same prompts and samples its own contiguous rows of the global batch with
its own noise; rewards are gathered so that advantages are computed over whole groups; the
strategy's backward passes communicate nothing, and the accumulated gradients are reduced once
per optimizer step (all-reduced under DDP, reduce-scattered to shards under FSDP).
"""
from __future__ import annotations

import torch

from jagg_lab.sharding import FSDPStrategy, is_sharded, sum_gradients

__all__ = ["ProcessWiring"]


class ProcessWiring:
    """A LightningModule mixin: the module's rank, row gathering, sharding and gradient sync.
    Expects `policy`, `ema`, `objective` (its `ref_policy`), `strategy` and `trainable_parameters()` on the module."""

    @property
    def shard(self) -> tuple[int, int]:
        """(rank, world_size) of this process; (0, 1) outside a distributed trainer."""
        trainer = self._trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def gather_rows(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's rows of a batch, concatenated in global row order."""
        return local if self.shard[1] == 1 else self.all_gather(local.contiguous()).flatten(0, 1)

    def configure_model(self) -> None:
        """Under `trainer=fsdp`, shard the policy and its EMA and KL-reference copies."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, FSDPStrategy) and not is_sharded(self.policy):
            strategy.shard(self.policy, self.ema, self.objective.ref_policy, diagnostics=bool(self.strategy.diagnose_every))

    def sync_gradients(self) -> None:
        """Sum the accumulated gradients over ranks: the one collective of an optimizer step
        (an all-reduce, or under FSDP a reduce-scatter to shards; `jagg_lab.sharding`). Each rank's
        micro-batches were scaled by their share of the global batch, so the sum is the gradient
        of the global mean loss."""
        sum_gradients(self.policy, self.trainable_parameters())
