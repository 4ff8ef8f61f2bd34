"""How far a trained policy moved from its reference: the KL along its own SDE trajectories.

Sample trajectories with the trained policy's SDE (the training sampler: its noise levels,
noise scale `a` and CFG scale) from fixed noise on the given prompts. Step k's transition is
Gaussian under both policies with the same covariance, p(x_{k+1} | x_k) = N(mu_k(x_k), sigma_k^2 I),
so per step and sample

    KL_k = || mu_k^trained(x_k) - mu_k^base(x_k) ||^2 / (2 sigma_k^2 D),

with D = channels x height x width: the exact KL per dimension (sigma_k = std_k sqrt(-dt) is the
transition's std). The `kl` column of metrics.csv is the training loss's KL term, Flow-GRPO's
scale, which divides by std_k^2 instead: (-dt) x this KL_k at step k. `mean` averages KL_k over
steps and samples, `per_step` over samples. By the chain rule, D * T * mean is the KL between the
two policies' whole trajectory distributions from the same noise, which bounds the KL between
their samples.

Typical use::

    policy, base, sampler = run_policies("outputs/runs/RUN")
    trajectory_kl(policy, base, eval_prompts(64, seed=1), sampler.noise_levels(policy),
                  noise_level=sampler.noise_level, guidance=sampler.guidance, seed=1).mean
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jagg_lab.policies import VelocityPolicy, guided_velocity_fn
from jagg_lab.sampling import sde_mean, sde_rollout, sde_std, transition_kl

__all__ = ["TrajectoryKL", "trajectory_kl"]


@dataclass(frozen=True)
class TrajectoryKL:
    mean: float  # mean over steps and samples of the per-dimension KL
    per_step: tuple[float, ...]  # (T,) mean over samples, step k = 0 at pure noise
    path: float  # D * sum_k per_step[k]: KL between the trajectory distributions


@torch.inference_mode()
def trajectory_kl(
    policy: VelocityPolicy,
    base: VelocityPolicy,
    prompts: list[str],
    noise_levels: torch.Tensor,
    *,
    noise_level: float,
    guidance: float,
    seed: int,
    batch_size: int = 64,
) -> TrajectoryKL:
    """KL(trained || base) along the trained policy's SDE trajectories (module docstring).

    Each policy conditions on its own prompt encoding; noise is fixed by `seed`. The rollout
    records the reference's SDE means, so each step's KL is one closed form per sample.
    """
    if not prompts:
        raise ValueError("trajectory_kl needs at least one prompt")
    generator = torch.Generator().manual_seed(seed)
    device = next(policy.parameters()).device
    levels = noise_levels.tolist()
    totals = torch.zeros(len(levels) - 1, dtype=torch.float64)
    null, base_null = policy.encode_prompts([""]), base.encode_prompts([""])
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        cond, base_cond = policy.encode_prompts(chunk), base.encode_prompts(chunk)
        noise = torch.randn((len(chunk), *policy.sample_shape), generator=generator).to(device)
        rollout = sde_rollout(
            guided_velocity_fn(policy, cond, null, guidance),
            noise, noise_levels.to(device), noise_level=noise_level, cond=cond, null_cond=null,
            ref_velocity_fn=guided_velocity_fn(base, base_cond, base_null, guidance),
            generator=generator,
        )
        for k in range(rollout.num_steps):
            std_k, std = sde_std(levels[k], levels[k + 1], rollout.noise_level, rollout.s_first_below_one)
            mean = sde_mean(rollout.states[:, k], rollout.velocities[:, k], levels[k], levels[k + 1], std_k)  # (B, *X)
            kl = transition_kl(mean, rollout.ref_means[:, k], std)  # (B,)
            totals[k] += kl.double().sum().cpu()
    per_step = totals / len(prompts)
    dims = int(torch.tensor(policy.sample_shape).prod())
    return TrajectoryKL(mean=float(per_step.mean()), per_step=tuple(per_step.tolist()), path=float(per_step.sum() * dims))
