"""The Lightning module: the only place that wires the GRPO stages together.

One training_step = one rollout batch: prompts -> SDE rollouts (no grad) -> rewards ->
group advantages -> for each optimizer step: the gradient phase over micro-batches ->
clip -> step -> one metrics row. The math of each stage lives in its package (the loss
and gradient phase in `grpo.objective`); this module holds the Lightning wiring: processes,
optimizer and EMA, checkpoints, logging. Manual optimization, because GRPO takes several
optimizer steps per batch and the strategy, not Lightning, runs the backward passes.

Across processes (DDP, or FSDP through `jagg_lab.sharding`) see `jagg_lab.processes`: each
rank samples its own rows, advantages cover whole groups, gradients are reduced once per step.
"""
from __future__ import annotations

import dataclasses
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

from jagg_lab.checkpointing import rng_state, set_rng_state
from jagg_lab.grpo import GRPOConfig, GRPOObjective, StepStats, rollout_advantages
from jagg_lab.objectives import ForwardObjective, Samples, TrajectoryGRPO
from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.policies.reference import AdaptersOff, reference_policy
from jagg_lab.rewards.base import Reward, check_scores
from jagg_lab.sampling import SDESampler, sde_rollout, shard_noise
from jagg_lab.processes import ProcessWiring
from jagg_lab.sharding import export_weights, gather_for_passes, memory_mib, resident_mib
from jagg_lab.strategies import GradientStrategy
from jagg_lab.strategies.core import combine_stats
from jagg_lab.types import Rollout

__all__ = ["GRPOModule", "AdaptersOff"]

log = logging.getLogger(__name__)

class GRPOModule(ProcessWiring, L.LightningModule):
    """policy: a VelocityPolicy. sampler: SDESampler. reward: a Reward. strategy: a
    GradientStrategy. grpo: GRPOConfig. optimizer: a partial optimizer (params -> Optimizer).
    group_size: samples per prompt. seed: drives rollout noise (per step, so resume is exact).
    sample_every: write a PNG grid of rollout samples every N rollouts (0 = never).
    max_bad_steps: a non-finite reward, loss or gradient skips the optimizer step (logged,
    counted in `skipped_steps`); this many in a row stop the run with an error.
    log_memory: each metrics row also holds the process's resident memory (`memory_rss_mib`).
    compile_rollout: the rollout's policy calls go through `torch.compile` (the gradient phase
    stays eager); its first rollout pays the compilation.
    objective: TrajectoryGRPO (default: the GRPO loss of the sampled SDE steps, through `strategy`)
    or a ForwardObjective (AWM, DiffusionNFT: ODE rollouts, the flow-matching loss at forward-noised
    states of the final samples; `strategy` and the trajectory settings of `grpo` are not used)."""

    def __init__(self, policy: nn.Module, sampler: SDESampler, reward: Reward, strategy: GradientStrategy,
                 grpo: GRPOConfig, optimizer: Callable, group_size: int, seed: int = 0, sample_every: int = 10,
                 run_dir: str | None = None, max_bad_steps: int = 3, compile_rollout: bool = False,
                 objective: TrajectoryGRPO | ForwardObjective | None = None, log_memory: bool = False):
        super().__init__()
        if max_bad_steps < 1:
            raise ValueError(f"max_bad_steps must be >= 1, got {max_bad_steps}")
        self.automatic_optimization = False
        self.policy, self.sampler, self.reward, self.strategy, self.grpo = policy, sampler, reward, strategy, grpo
        self.objective = GRPOObjective.from_config(grpo, sampler.num_steps, sampler.guidance)
        if objective is None or not isinstance(objective, ForwardObjective):
            self.objective.check_strategy(strategy)
        self.trained_steps = list(self.objective.trained_steps)
        # checked before any work; a moving SDE window (grpo.window_size) has its phases per rollout
        self.ode_phases = sampler.ode_phases(self.trained_steps) if grpo.window_size is None else {}
        sampler.noise_levels(policy)  # likewise: the grid (sampler.schedule) fits the policy
        self.compile_rollout(compile_rollout)
        self.optimizer_factory = optimizer
        self.group_size, self.seed, self.sample_every = group_size, seed, sample_every
        self.run_dir = Path(run_dir) if run_dir else None
        self.max_bad_steps, self.log_memory = max_bad_steps, log_memory
        self.forward_objective = objective if isinstance(objective, ForwardObjective) else None
        # The KL reference is the policy as it starts; nothing when KL is off.
        kl = self.forward_objective.needs_reference if self.forward_objective is not None else grpo.beta
        self.ref_policy = reference_policy(policy) if kl else None
        if self.forward_objective is not None:
            self.forward_objective.attach(policy, self.trainable_parameters(), sampler.guidance, self.ref_policy)
        self.ema = (AveragedModel(policy, multi_avg_fn=get_ema_multi_avg_fn(grpo.ema_decay), use_buffers=True)
                    if grpo.ema_decay else None)
        self.step_metrics = nn.ModuleDict({name: MeanMetric() for name in StepStats.__dataclass_fields__})
        self.rollouts_done = self.bad_steps_in_a_row = self.skipped_steps = 0

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def configure_optimizers(self):
        return self.optimizer_factory(self.trainable_parameters())

    def compile_rollout(self, on: bool) -> None:
        """Route the rollout's policy calls through torch.compile (a function, not a module, so the
        state dict keeps one copy of the weights) or back to the eager policy."""
        self.compiled_forward = torch.compile(self.policy.forward) if on else None

    # ---- stages --------------------------------------------------------------------
    def make_rollout(self, prompts: list[str], generator: torch.Generator) -> Rollout | Samples:
        """SDE rollouts of this rank's rows (a forward-process objective: its ODE samples and
        training states); `generator` is shared by all ranks (see shard_noise)."""
        with torch.inference_mode():
            cond = self.policy.encode_prompts(prompts)
            null_cond = self.policy.encode_prompts([""])
        noise = self.initial_noise(len(prompts), generator)
        if self.forward_objective is not None:
            samples = self.forward_objective.rollout(self.policy, self.trainable_parameters(), cond, null_cond, noise,
                                           self.sampler.noise_levels(self.policy).to(self.device), generator, self.shard)
            return self.forward_objective.prepare(self.policy, samples.for_training(),
                                                  off_policy=self.grpo.optimizer_steps_per_rollout > 1,
                                                  micro_batch_size=self.grpo.micro_batch_size)
        guidance = self.sampler.guidance
        window = self.window() if self.grpo.window_size is not None else None
        phases = self.ode_phases if window is None else self.sampler.window_phases(window)
        rollout = sde_rollout(
            guided_velocity_fn(self.compiled_forward or self.policy, cond, null_cond, guidance), noise, self.sampler.noise_levels(self.policy).to(self.device),
            noise_level=self.sampler.noise_level, cond=cond, null_cond=null_cond,
            reduction=self.sampler.log_prob_reduction,
            ref_velocity_fn=guided_velocity_fn(self.ref_policy, cond, null_cond, guidance) if self.ref_policy is not None else None,
            ref_steps=window or self.trained_steps, generator=generator, shard=self.shard, **phases,
        )
        if window is not None:
            rollout = dataclasses.replace(rollout, trained_steps=tuple(window))
        return rollout.for_training()

    def initial_noise(self, rows: int, generator: torch.Generator) -> torch.Tensor:
        """This rank's rows of the rollout's initial noise: one draw per sample, or with
        sampler.group_noise one per prompt group, shared by its group_size consecutive rows."""
        shape = tuple(self.policy.sample_shape)
        if not self.sampler.group_noise:
            return shard_noise((rows, *shape), generator, self.shard, self.device)
        rank, world = self.shard
        total = rows * world
        if total % self.group_size:
            raise ValueError(f"sampler.group_noise: {total} rows are not whole groups of {self.group_size}")
        groups = torch.randn((total // self.group_size, *shape), generator=generator)
        return groups.repeat_interleave(self.group_size, 0)[rank * rows:(rank + 1) * rows].to(self.device)

    def window(self) -> list[int]:
        """The trained steps of rollout `rollouts_done` under a moving SDE window (its own draw:
        the rollout's noise is the same as without a window)."""
        draw = torch.Generator().manual_seed(2**40 + self.seed * 1_000_003 + self.rollouts_done)  # apart from the noise seeds
        return self.grpo.window(self.sampler.num_steps, self.rollouts_done, draw)

    def block_generator(self, idx: torch.Tensor) -> torch.Generator | None:
        """The draw of micro-batch `idx`'s trained blocks (grpo.block_fraction < 1; else None), from
        the run's seed, the rollout and the micro-batch's first row on this rank: a resumed step draws the same."""
        if not self.grpo.draws_blocks:
            return None
        rollout = 2**41 + self.seed * 1_000_003 + self.rollouts_done  # apart from the noise and window seeds
        return torch.Generator().manual_seed(rollout * 1_000_033 + self.shard[0] * 100_003 + int(idx[0]))

    def rollout_generator(self) -> torch.Generator:
        """The noise of rollout `rollouts_done` of this run: a resumed or re-run step draws the same."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + self.rollouts_done)

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Advantages of the whole global batch (every rank computes the same ones)."""
        shuffle = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rollouts_done + 1)
        return rollout_advantages(rewards, group_ids, self.grpo, shuffle)

    def micro_batch_backward(self, rollout: Rollout, advantages: torch.Tensor, idx: torch.Tensor, scale: float,
                             on_policy: bool) -> dict:
        """The gradient phase of one micro-batch; its loss statistics go to `step_metrics`."""
        if self.forward_objective is not None:
            stats, steps = self.forward_objective.backward(self.policy, self.trainable_parameters(), rollout, advantages, idx,
                                                 scale=scale, on_policy=on_policy)
        else:
            stats, steps = self.objective.backward(self.strategy, self.policy, rollout, advantages, idx, scale=scale,
                                                   on_policy=on_policy, params=self.trainable_parameters(),
                                                   draw=self.block_generator(idx))
        for step in steps:
            for name, metric in self.step_metrics.items():
                metric.update(getattr(step, name))
        return stats

    def accumulate_gradients(self, rollout: Rollout, advantages: torch.Tensor, chunk: torch.Tensor, on_policy: bool,
                             chunk_size: int) -> dict[str, float]:
        """The strategy over the micro-batches of `chunk` (this rank's rows of an optimizer
        step's `chunk_size` samples); returns their stats combined (`combine_stats`)."""
        self.policy.train()
        gather_for_passes(self.policy)  # FSDP: the one all-gather; the passes communicate nothing
        return combine_stats([self.micro_batch_backward(rollout, advantages, idx, len(idx) / chunk_size, on_policy)
                              for idx in chunk.split(self.grpo.micro_batch_size)])

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

    # ---- the GRPO step -------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> None:
        opt = self.optimizers()
        rank, world = self.shard
        total = len(batch["prompts"]) * self.group_size
        if total % world:
            raise ValueError(f"{total} samples per step do not split over {world} processes")
        rows = slice(rank * total // world, (rank + 1) * total // world)
        prompts = [p for p in batch["prompts"] for _ in range(self.group_size)][rows]
        metadata = [m for m in batch["metadata"] for _ in range(self.group_size)][rows]
        group_ids = torch.arange(len(batch["prompts"]), device=self.device).repeat_interleave(self.group_size)
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
        advantages = self.advantages(rewards, group_ids)
        if self.forward_objective is not None:  # its per-sample reward weights
            advantages = self.forward_objective.sample_weights(advantages, self.grpo.adv_clip_max)
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
        if self.forward_objective is not None and finite_rewards:
            self.forward_objective.after_rollout(self.trainable_parameters(), self.global_step)
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

    # ---- exact resume: counters that are not parameters ------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint.update(rollouts_done=self.rollouts_done, skipped_steps=self.skipped_steps,
                          strategy=self.strategy.state_dict(), rng=rng_state())
        if self.forward_objective is not None:
            checkpoint["objective"] = self.forward_objective.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.rollouts_done = checkpoint["rollouts_done"]
        self.skipped_steps = checkpoint["skipped_steps"]
        self.strategy.load_state_dict(checkpoint["strategy"])
        set_rng_state(checkpoint["rng"])
        if self.forward_objective is not None:
            self.forward_objective.load_state_dict(checkpoint["objective"])
