"""Rollouts: run the SDE (for GRPO) or the ODE (for evaluation) from noise to a sample."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from jagg_lab.sampling.sde import ode_step, sde_mean, sde_std, sde_step
from jagg_lab.types import Cond, ODEPhase, Rollout

__all__ = ["VelocityFn", "ODE_SOLVERS", "ode_integrate", "phase_levels", "sde_rollout", "ode_sample", "shard_noise"]

# velocity_fn(x (B, *X), s (B,)) -> v (B, *X)
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def shard_noise(
    shape: tuple[int, ...],
    generator: torch.Generator | None,
    shard: tuple[int, int] = (0, 1),
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    group: int | None = None,
) -> torch.Tensor:
    """Standard normal noise for one process's rows of a batch split across processes.

    shape is this process's (B, *X); shard = (rank, world_size). The noise of the whole
    (world_size * B) batch is drawn and this rank's contiguous rows are kept, so a sample's
    noise depends only on the generator and its global row: ranks never share noise, and
    a 2-process run samples exactly what a 1-process run of the same global batch does. With
    `group` (sampler.group_noise): one draw per group of `group` consecutive global rows, shared by them.
    """
    rank, world = shard
    if not 0 <= rank < world:
        raise ValueError(f"shard rank {rank} is outside a world of {world} processes")
    total = world * shape[0]
    if group is None:
        full = torch.randn((total, *shape[1:]), generator=generator, dtype=dtype)
    elif total % group:
        raise ValueError(f"sampler.group_noise: {total} rows are not whole groups of {group}")
    else:
        full = torch.randn((total // group, *shape[1:]), generator=generator, dtype=dtype).repeat_interleave(group, 0)
    return full[rank * shape[0]:(rank + 1) * shape[0]].to(device)


# Deterministic solvers for the parts of a rollout that no gradient reads (and for evaluation):
# euler (1 policy call per step), heun (2 per step; the final step to s = 0 is Euler, where the
# corrector's velocity is not defined), ab2 (second-order Adams-Bashforth on the velocity, 1 call
# per step, the first step Euler).
ODE_SOLVERS = ("euler", "heun", "ab2")


def check_solver(solver: str, key: str = "solver") -> None:
    if solver not in ODE_SOLVERS:
        raise ValueError(f"{key} must be one of {ODE_SOLVERS}, got {solver!r}")


def ode_integrate(velocity_fn: VelocityFn, x: torch.Tensor, levels: Sequence[float], solver: str = "euler") -> tuple[torch.Tensor, int]:
    """Integrate dx/ds = v from levels[0] down to levels[-1]; returns (x, policy calls made)."""
    check_solver(solver)
    calls, previous = 0, None  # previous: (v, step size) of the last step, for ab2

    def velocity(x_now: torch.Tensor, s: float) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return velocity_fn(x_now, torch.full((x_now.shape[0],), s, device=x_now.device, dtype=x_now.dtype))

    for s, s_next in zip(levels[:-1], levels[1:]):
        v = velocity(x, s)
        h = s_next - s
        if solver == "heun" and s_next > 0:
            x_pred = ode_step(x, v, s, s_next)
            x = x + 0.5 * h * (v + velocity(x_pred, s_next))
        elif solver == "ab2" and previous is not None:
            v_prev, h_prev = previous
            x = x + h * ((1 + h / (2 * h_prev)) * v - (h / (2 * h_prev)) * v_prev)
        else:
            x = ode_step(x, v, s, s_next)
        previous = (v, h)
    return x, calls


def phase_levels(levels: Sequence[float], first: int, end: int, steps: int | None) -> list[float]:
    """Noise levels of an ODE over grid steps first .. end - 1 (from levels[first] to levels[end])
    in `steps` steps (None: the grid's own), spaced like the grid: at evenly spaced fractional
    grid positions, interpolated linearly, so a shifted schedule keeps its density."""
    steps = end - first if steps is None else steps
    if steps < 1:
        raise ValueError(f"an ODE phase needs at least one step, got {steps}")
    positions = torch.linspace(first, end, steps + 1, dtype=torch.float64)
    grid = torch.tensor(list(levels), dtype=torch.float64)
    low = positions.floor().long().clamp(max=len(grid) - 2)
    frac = positions - low
    out = ((1 - frac) * grid[low] + frac * grid[low + 1]).tolist()
    out[0], out[-1] = float(levels[first]), float(levels[end])  # exact ends
    return out


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
    sde_span: tuple[int, int] | None = None,
    head: tuple[str, int | None] | None = None,
    tail: tuple[str, int | None] | None = None,
) -> Rollout:
    """Sample x_0 ~ noise -> x_T with the SDE, recording everything GRPO re-evaluates.

    `initial_noise` is (B, *X); `noise_levels` is (T + 1,). The reference policy (for KL)
    is evaluated at the same states, so its means are cached once here: at `ref_steps` only
    (default every step; the steps GRPO trains are enough), NaN at the others. shard = (rank,
    world_size) when the batch is this process's rows of a larger one (see shard_noise).

    sde_span = (a, b): only grid steps a..b are SDE steps (the trained ones lie there); `head`
    and `tail`, each (solver, steps or None for the grid's own), sample the steps before a and
    after b by a deterministic ODE instead (`ode_integrate`), recorded as NaN and in
    `Rollout.ode_phases`; without a head the steps before a stay SDE steps, likewise after b.
    The noise of skipped head steps is still drawn, so the SDE steps see the noise they would
    see with the SDE everywhere: the trained transitions are the same whatever the tail.
    """
    x = initial_noise
    levels = noise_levels.tolist()
    num = len(levels) - 1
    a, b = (0, num - 1) if sde_span is None else sde_span
    if not 0 <= a <= b < num:
        raise ValueError(f"sde_span {sde_span} is not a range of the {num} sampling steps")
    if (head or tail) and sde_span is None:
        raise ValueError("an ODE head or tail needs sde_span, the SDE steps between them")
    s_first_below_one = levels[1]
    batch = x.shape[0]
    nan = torch.full_like(x, math.nan)
    phases, forwards = [], 0

    def ode_phase(x: torch.Tensor, first: int, end: int, spec: tuple[str, int | None]) -> torch.Tensor:
        nonlocal forwards
        solver, steps = spec
        phase = phase_levels(levels, first, end, steps)
        x, calls = ode_integrate(velocity_fn, x, phase, solver)
        phases.append(ODEPhase(first=first, end=end, solver=solver, steps=len(phase) - 1, forwards=calls))
        forwards += calls
        return x

    states, nexts, log_probs, velocities, ref_means = [], [], [], [], []

    def skipped(k: int) -> None:
        states.append(nan)
        nexts.append(nan)
        velocities.append(nan)
        log_probs.append(torch.full((batch,), math.nan, device=x.device, dtype=x.dtype))
        if ref_velocity_fn is not None:
            ref_means.append(nan)

    if head is not None and a > 0:
        for k in range(a):
            shard_noise(tuple(x.shape), generator, shard, x.device, x.dtype)  # drawn, unused: see the docstring
            skipped(k)
        x = ode_phase(x, 0, a, head)
    first = a if head is not None else 0
    last = b if tail is not None else num - 1
    for k in range(first, last + 1):
        s, s_next = levels[k], levels[k + 1]
        s_vec = torch.full((batch,), s, device=x.device, dtype=x.dtype)
        v = velocity_fn(x, s_vec)
        forwards += 1
        noise = shard_noise(tuple(x.shape), generator, shard, x.device, x.dtype)
        step = sde_step(
            x, v, s, s_next,
            noise_level=noise_level, s_first_below_one=s_first_below_one, noise=noise, reduction=reduction,
        )
        if ref_velocity_fn is not None and (ref_steps is None or k in ref_steps):
            std_k, _ = sde_std(s, s_next, noise_level, s_first_below_one)
            ref_means.append(sde_mean(x, ref_velocity_fn(x, s_vec), s, s_next, std_k))
        elif ref_velocity_fn is not None:
            ref_means.append(nan)
        states.append(x)
        nexts.append(step.sample)
        log_probs.append(step.log_prob)
        velocities.append(v)
        x = step.sample
    if tail is not None and b < num - 1:
        for k in range(b + 1, num):
            skipped(k)
        x = ode_phase(x, b + 1, num, tail)
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
        ode_phases=tuple(phases),
        forwards=forwards,
    )


@torch.inference_mode()
def ode_sample(velocity_fn: VelocityFn, initial_noise: torch.Tensor, noise_levels: torch.Tensor) -> torch.Tensor:
    """Deterministic Euler sampling, for evaluation. Returns x_T, (B, *X)."""
    return ode_integrate(velocity_fn, initial_noise, noise_levels.tolist(), "euler")[0]
