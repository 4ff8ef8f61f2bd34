"""The Lightning module: the only place that wires the GRPO stages together.

One training_step = one rollout batch: prompts -> rollouts (no grad) -> rewards -> group
advantages -> the objective's per-sample weights -> for each optimizer step: the gradient phase
over micro-batches -> clip -> step -> one metrics row. What is sampled and optimised is the
objective's (`jagg_lab.objectives`: the stages of `Objective`, the same calls whatever its
kind); this module holds the Lightning wiring: processes, optimizer and EMA, checkpoints,
logging. Manual optimization, because GRPO takes several optimizer steps per batch and the
objective (its gradient strategy), not Lightning, runs the backward passes.

Across processes (DDP, or FSDP through `jagg_lab.sharding`) see `jagg_lab.processes`: each
rank samples its own rows, advantages cover whole groups, gradients are reduced once per step.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Callable

import lightning as L
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torchmetrics import MeanMetric

from jagg_lab.grpo import GRPOConfig, StepStats, expand_groups, rollout_advantages
from jagg_lab.objectives import Objective, TrajectoryGRPO
from jagg_lab.policies.reference import AdaptersOff
from jagg_lab.rewards.base import Reward, check_scores
from jagg_lab.sampling import SDESampler, shard_noise
from jagg_lab.processes import ProcessWiring
from jagg_lab.sharding import export_weights, gather_for_passes, memory_mib, resident_mib
from jagg_lab.strategies import GradientStrategy
from jagg_lab.strategies.core import combine_stats
from jagg_lab.types import Rollout
from jagg_lab.updates import StepUpdate

__all__ = ["GRPOModule", "AdaptersOff"]

log = logging.getLogger(__name__)


def _objectives(name: str, doc: str) -> property:
    """A module attribute that is the objective's: read from it and set on it."""
    return property(lambda self: getattr(self.objective, name), lambda self, value: setattr(self.objective, name, value),
                    doc=doc)


class GRPOModule(ProcessWiring, StepUpdate, L.LightningModule):
    """policy: a VelocityPolicy. sampler: SDESampler. reward: a Reward. strategy: a
    GradientStrategy. grpo: GRPOConfig. optimizer: a partial optimizer (params -> Optimizer).
    group_size: samples per prompt. seed: drives rollout noise (per step, so resume is exact).
    sample_every: write a PNG grid of rollout samples every N rollouts (0 = never).
    max_bad_steps: a non-finite reward, loss or gradient skips the optimizer step (logged,
    counted in `skipped_steps`); this many in a row stop the run with an error.
    log_memory: each metrics row also holds the process's resident memory (`memory_rss_mib`).
    compile_rollout: the rollout's policy calls go through `torch.compile` (the gradient phase
    stays eager); its first rollout pays the compilation.
    objective: an Objective (default TrajectoryGRPO: the GRPO loss of the sampled SDE steps, through
    `strategy`; AWM, DiffusionNFT: ODE rollouts, the flow-matching loss at forward-noised states of
    the final samples, `strategy` and the trajectory settings of `grpo` unused)."""

    def __init__(self, policy: nn.Module, sampler: SDESampler, reward: Reward, strategy: GradientStrategy,
                 grpo: GRPOConfig, optimizer: Callable, group_size: int, seed: int = 0, sample_every: int = 10,
                 run_dir: str | None = None, max_bad_steps: int = 3, compile_rollout: bool = False,
                 objective: Objective | None = None, log_memory: bool = False):
        super().__init__()
        if max_bad_steps < 1:
            raise ValueError(f"max_bad_steps must be >= 1, got {max_bad_steps}")
        self.automatic_optimization = False
        self.policy, self.reward, self.grpo = policy, reward, grpo
        # Not a submodule: the frozen copies it keeps are neither trained nor seen by the trainer.
        self.objective = objective if objective is not None else TrajectoryGRPO()
        self.objective.setup(policy, self.trainable_parameters(), sampler, grpo, strategy, seed)
        sampler.noise_levels(policy)  # checked before any work: the grid (sampler.schedule) fits the policy
        self.compile_rollout(compile_rollout)
        self.optimizer_factory = optimizer
        self.group_size, self.seed, self.sample_every = group_size, seed, sample_every
        self.run_dir = Path(run_dir) if run_dir else None
        self.max_bad_steps, self.log_memory = max_bad_steps, log_memory
        self.ema = (AveragedModel(policy, multi_avg_fn=get_ema_multi_avg_fn(grpo.ema_decay), use_buffers=True)
                    if grpo.ema_decay else None)
        self.step_metrics = nn.ModuleDict({name: MeanMetric() for name in StepStats.__dataclass_fields__})
        self.rollouts_done = self.bad_steps_in_a_row = self.skipped_steps = 0

    sampler = _objectives("sampler", "The run's sampler (the objective samples with it).")
    strategy = _objectives("strategy", "The gradient strategy the objective pushes its losses through (the trajectory objective's).")

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def configure_optimizers(self):
        return self.optimizer_factory(self.trainable_parameters())

    def compile_rollout(self, on: bool) -> None:
        """Route the rollout's policy calls through torch.compile, where the objective supports
        it (the trajectory objective), or back to the eager policy."""
        self.objective.compile(self.policy, on)

    def _apply(self, fn, *args, **kwargs):
        """Moves and casts (`.to`, the trainer's device) reach the objective's frozen copies too."""
        super()._apply(fn, *args, **kwargs)
        for frozen in self.objective.frozen_modules():
            frozen._apply(fn, *args, **kwargs)
        return self

    # ---- stages --------------------------------------------------------------------
    def make_rollout(self, prompts: list[str], generator: torch.Generator, index: int | None = None,
                     sampler: SDESampler | None = None) -> Rollout:
        """The objective's rollout batch of this rank's rows; `generator` is shared by all ranks
        (see shard_noise). index: the rollout's number (default: the run's next); sampler: another
        setting of the run's sampler (a benchmark's)."""
        with torch.inference_mode():
            cond = self.policy.encode_prompts(prompts)
            null_cond = self.policy.encode_prompts([""])
        noise = self.initial_noise(len(prompts), generator)
        return self.objective.sample(self.policy, self.trainable_parameters(), cond, null_cond, noise, generator,
                                     self.shard, self.rollouts_done if index is None else index, sampler)

    def groups(self, batch: dict) -> tuple[list[str], list[dict], torch.Tensor]:
        """A batch of prompts as the step samples it: each prompt and its metadata repeated
        `group_size` times, and the (B,) group id of every sample (the global batch)."""
        return expand_groups(batch["prompts"], self.group_size, batch.get("metadata"), self.device)

    def initial_noise(self, rows: int, generator: torch.Generator) -> torch.Tensor:
        """This rank's rows of the rollout's initial noise: one draw per sample, or with
        sampler.group_noise one per prompt group (see shard_noise)."""
        return shard_noise((rows, *self.policy.sample_shape), generator, self.shard, self.device,
                           group=self.group_size if self.sampler.group_noise else None)

    def rollout_generator(self, index: int | None = None) -> torch.Generator:
        """The noise of rollout `index` (default `rollouts_done`) of this run: a resumed or re-run step draws the same."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + (self.rollouts_done if index is None else index))

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor, index: int | None = None) -> torch.Tensor:
        """The objective's per-sample weights from the advantages of the whole global batch (every
        rank computes the same ones); index: the rollout's number (default `rollouts_done`)."""
        index = self.rollouts_done if index is None else index
        shuffle = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        return self.objective.weights(rollout_advantages(rewards, group_ids, self.grpo, shuffle))

    def micro_batch_backward(self, rollout: Rollout, advantages: torch.Tensor, idx: torch.Tensor, scale: float,
                             on_policy: bool, index: int | None = None) -> dict:
        """The gradient phase of one micro-batch of rollout `index` (default `rollouts_done`); its
        loss statistics go to `step_metrics`."""
        stats, steps = self.objective.backward(self.policy, self.trainable_parameters(), rollout, advantages, idx, scale=scale,
                                               on_policy=on_policy, shard=self.shard,
                                               index=self.rollouts_done if index is None else index)
        for step in steps:
            for name, metric in self.step_metrics.items():
                metric.update(getattr(step, name))
        return stats

    def accumulate_gradients(self, rollout: Rollout, advantages: torch.Tensor, chunk: torch.Tensor, on_policy: bool,
                             chunk_size: int, index: int | None = None) -> dict[str, float]:
        """The strategy over the micro-batches of `chunk` (this rank's rows of an optimizer
        step's `chunk_size` samples) of rollout `index` (default `rollouts_done`); returns their
        stats combined (`combine_stats`)."""
        self.policy.train()
        gather_for_passes(self.policy)  # FSDP: the one all-gather; the passes communicate nothing
        at = {} if index is None else {"index": index}  # a subclass overriding the five-argument hook keeps working
        return combine_stats([self.micro_batch_backward(rollout, advantages, idx, len(idx) / chunk_size, on_policy, **at)
                              for idx in chunk.split(self.grpo.micro_batch_size)])

    # ---- the GRPO step -------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> None:
        opt = self.optimizers()
        rank, world = self.shard
        total = len(batch["prompts"]) * self.group_size
        if total % world:
            raise ValueError(f"{total} samples per step do not split over {world} processes")
        rows = slice(rank * total // world, (rank + 1) * total // world)
        prompts, metadata, group_ids = self.groups(batch)
        prompts, metadata = prompts[rows], metadata[rows]
        generator = self.rollout_generator()

        t0 = time.perf_counter()
        self.policy.eval()
        rollout = self.make_rollout(prompts, generator)
        t1 = time.perf_counter()
        images = self.policy.decode(rollout.final)
        components = self.reward.components(images, prompts, metadata)
        local_rewards = check_scores(components["reward"], len(prompts), self.reward.name).to(self.device)
        rewards = self.gather_rows(local_rewards.float())
        t2 = time.perf_counter()
        finite_rewards = bool(torch.isfinite(rewards).all())
        if not finite_rewards:
            log.warning("reward %r gave %d non-finite scores at step %d; skipping this rollout", self.reward.name,
                        int((~torch.isfinite(rewards)).sum()), self.global_step)
            rewards = torch.nan_to_num(rewards, nan=0.0, posinf=0.0, neginf=0.0)
        advantages = self.advantages(rewards, group_ids)  # the objective's per-sample weights
        component_means = {k: self.gather_rows(v.float().to(self.device)).nanmean().item() for k, v in components.items() if k != "reward"}
        self.maybe_save_grid(images, rewards)

        # The permutation is over the global batch, so optimizer steps hold the same samples
        # whatever the number of processes; each rank trains its own rows of each.
        order = torch.randperm(total, generator=generator).to(self.device)
        for j, chunk in enumerate(order.chunk(self.grpo.optimizer_steps_per_rollout)):
            t3 = time.perf_counter()
            local = chunk[(chunk >= rows.start) & (chunk < rows.stop)] - rows.start
            # The first optimizer step on a rollout is on-policy; later ones see moved parameters.
            totals = {}
            if finite_rewards:
                totals = self.accumulate_gradients(rollout, advantages[rows], local, on_policy=(j == 0), chunk_size=len(chunk))
            grad_norm = self.apply_update(opt, finite_rewards)
            t4 = time.perf_counter()
            means = self.step_means() if finite_rewards else {name: math.nan for name in self.step_metrics}
            row = {
                "reward_mean": rewards.mean().item(), "reward_std": rewards.std(unbiased=False).item(), **means,
                "grad_norm": grad_norm, "time_rollout_s": t1 - t0 if j == 0 else 0.0,
                "time_reward_s": t2 - t1 if j == 0 else 0.0, "time_gradient_s": t4 - t3,
                "rollout_forwards": rollout.forwards if j == 0 else 0,
                "lr": opt.param_groups[0]["lr"], "skipped_steps": self.skipped_steps,
            }
            row.update({f"reward_{k}": v for k, v in component_means.items() if math.isfinite(v)})
            row.update({k: v for k, v in totals.items() if k != "loss"})
            if self.log_memory:
                row["memory_rss_mib"] = resident_mib()
            for metric in self.step_metrics.values():
                metric.reset()
            for logger in self.loggers:
                logger.log_metrics(row, step=self.global_step)
            self.log_dict({"reward": row["reward_mean"], "loss": row["loss"]}, prog_bar=True, logger=False, batch_size=total)
            if self.bad_steps_in_a_row >= self.max_bad_steps:
                raise RuntimeError(
                    f"{self.bad_steps_in_a_row} optimizer steps in a row had a non-finite reward, loss or gradient "
                    f"(reward {self.reward.name!r}); stopping. The last good state is in checkpoints/."
                )
        if finite_rewards:
            self.objective.after_rollout(self.trainable_parameters(), self.global_step)
        self.rollouts_done += 1

    def maybe_save_grid(self, images: torch.Tensor, rewards: torch.Tensor) -> None:
        """Every sample_every rollouts, leave the global batch's images and rewards for the
        SampleGrids callback to draw (gathered on every rank: a collective)."""
        due = self.sample_every and self.run_dir and self.rollouts_done % self.sample_every == 0
        self.grid_samples = (self.gather_rows(images.float()).cpu(), rewards.cpu()) if due else None

    def on_train_end(self) -> None:
        """Export the trained weights (and the EMA's), whole, where `jagg_lab.evaluate checkpoint=`
        reads them; under FSDP every rank helps gather them. Logs this rank's memory."""
        log.info("rank %d holds (MiB): %s", self.shard[0], memory_mib(self.trainable_parameters(), self.optimizers().optimizer))
        if self.run_dir and hasattr(self.policy, "save"):
            export_weights(self.policy, self.run_dir / "policy.safetensors")
            if self.ema is not None:
                export_weights(self.ema.module, self.run_dir / "policy_ema.safetensors")
