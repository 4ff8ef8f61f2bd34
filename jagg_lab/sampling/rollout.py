"""Rollouts: run the SDE (for GRPO) or the ODE (for evaluation) from noise to a sample."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from jagg_lab.sampling.sde import ode_step, sde_mean, sde_std, sde_step
from jagg_lab.types import Cond, Rollout

__all__ = ["VelocityFn", "sde_rollout", "ode_sample", "shard_noise"]

# velocity_fn(x (B, *X), s (B,)) -> v (B, *X)
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def shard_noise(
    shape: tuple[int, ...],
    generator: torch.Generator | None,
    shard: tuple[int, int] = (0, 1),
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Standard normal noise for one process's rows of a batch split across processes.

    shape is this process's (B, *X); shard = (rank, world_size). The noise of the whole
    (world_size * B) batch is drawn and this rank's contiguous rows are kept, so a sample's
    noise depends only on the generator and its global row: ranks never share noise, and
    a 2-process run samples exactly what a 1-process run of the same global batch does.
    """
    rank, world = shard
    if not 0 <= rank < world:
        raise ValueError(f"shard rank {rank} is outside a world of {world} processes")
    full = torch.randn((world * shape[0], *shape[1:]), generator=generator, dtype=dtype)
    return full[rank * shape[0]:(rank + 1) * shape[0]].to(device)


@torch.inference_mode()
def sde_rollout(
    velocity_fn: VelocityFn,
    initial_noise: torch.Tensor,
    noise_levels: torch.Tensor,
    *,
    noise_level: float,
    cond: Cond,
    null_cond: Cond,
    reduction: str = "mean",
    ref_velocity_fn: VelocityFn | None = None,
    ref_steps: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    shard: tuple[int, int] = (0, 1),
) -> Rollout:
    """Sample x_0 ~ noise -> x_T with the SDE, recording everything GRPO re-evaluates.

    `initial_noise` is (B, *X); `noise_levels` is (T + 1,). The reference policy (for KL)
    is evaluated at the same states, so its means are cached once here: at `ref_steps` only
    (default every step; the steps GRPO trains are enough), NaN at the others. shard = (rank,
    world_size) when the batch is this process's rows of a larger one (see shard_noise).
    """
    x = initial_noise
    levels = noise_levels.tolist()
    s_first_below_one = levels[1]
    batch = x.shape[0]
    states, nexts, log_probs, velocities, ref_means = [], [], [], [], []
    for k in range(len(levels) - 1):
        s, s_next = levels[k], levels[k + 1]
        s_vec = torch.full((batch,), s, device=x.device, dtype=x.dtype)
        v = velocity_fn(x, s_vec)
        noise = shard_noise(tuple(x.shape), generator, shard, x.device, x.dtype)
        step = sde_step(
            x, v, s, s_next,
            noise_level=noise_level, s_first_below_one=s_first_below_one, noise=noise, reduction=reduction,
        )
        if ref_velocity_fn is not None and (ref_steps is None or k in ref_steps):
            std_k, _ = sde_std(s, s_next, noise_level, s_first_below_one)
            ref_means.append(sde_mean(x, ref_velocity_fn(x, s_vec), s, s_next, std_k))
        elif ref_velocity_fn is not None:
            ref_means.append(torch.full_like(x, math.nan))
        states.append(x)
        nexts.append(step.sample)
        log_probs.append(step.log_prob)
        velocities.append(v)
        x = step.sample
    return Rollout(
        states=torch.stack(states, 1),
        next_states=torch.stack(nexts, 1),
        noise_levels=noise_levels,
        log_probs=torch.stack(log_probs, 1),
        velocities=torch.stack(velocities, 1),
        ref_means=torch.stack(ref_means, 1) if ref_means else None,
        cond=cond,
        null_cond=null_cond,
        final=x,
        noise_level=noise_level,
        log_prob_reduction=reduction,
    )


@torch.inference_mode()
def ode_sample(velocity_fn: VelocityFn, initial_noise: torch.Tensor, noise_levels: torch.Tensor) -> torch.Tensor:
    """Deterministic Euler sampling, for evaluation. Returns x_T, (B, *X)."""
    x = initial_noise
    levels = noise_levels.tolist()
    for s, s_next in zip(levels[:-1], levels[1:]):
        s_vec = torch.full((x.shape[0],), s, device=x.device, dtype=x.dtype)
        x = ode_step(x, velocity_fn(x, s_vec), s, s_next)
    return x
