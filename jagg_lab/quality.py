"""How good a trained policy is, and how far it moved from its base: held-out verifier
accuracy, FID/KID against the world's renders, and the KL divergence to the base policy.

KL to the base (`trajectory_kl`). Sample trajectories with the trained policy's SDE (the
training sampler: its noise levels, noise scale `a` and CFG scale) from fixed noise on the
given prompts. Step k's transition is Gaussian under both policies with the same covariance,
p(x_{k+1} | x_k) = N(mu_k(x_k), sigma_k^2 I), so per step and sample

    KL_k = || mu_k^trained(x_k) - mu_k^base(x_k) ||^2 / (2 sigma_k^2 D),

with D = channels x height x width: the KL per dimension, Flow-GRPO's normalisation and that
of the `kl` column of metrics.csv. `mean` averages KL_k over steps and samples, `per_step`
over samples. By the chain rule, D * T * mean is the KL between the two policies' whole
trajectory distributions from the same noise, which bounds the KL between their samples.

Typical use::

    policy, base, sampler = run_policies("outputs/runs/RUN")
    trajectory_kl(policy, base, eval_prompts(64, seed=1), sampler.noise_levels(),
                  noise_level=sampler.noise_level, guidance=sampler.guidance, seed=1).mean
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from jagg_lab.evaluate import eval_prompts, sample_images, score_images
from jagg_lab.metrics import fid_kid
from jagg_lab.policies import guided_velocity
from jagg_lab.sampling import SDESampler, sde_mean, sde_rollout, sde_std, transition_kl

__all__ = ["TrajectoryKL", "trajectory_kl", "run_policies", "policy_quality"]


@dataclass(frozen=True)
class TrajectoryKL:
    mean: float  # mean over steps and samples of the per-dimension KL
    per_step: tuple[float, ...]  # (T,) mean over samples, step k = 0 at pure noise
    path: float  # D * sum_k per_step[k]: KL between the trajectory distributions


@torch.inference_mode()
def trajectory_kl(
    policy: nn.Module,
    base: nn.Module,
    prompts: list[str],
    noise_levels: torch.Tensor,
    *,
    noise_level: float,
    guidance: float,
    seed: int,
    batch_size: int = 64,
) -> TrajectoryKL:
    """KL(trained || base) along the trained policy's SDE trajectories (module docstring).
    Each policy conditions on its own prompt encoding; noise is fixed by `seed`."""
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
            lambda x, s: guided_velocity(policy, x, s, cond, null, guidance),
            noise, noise_levels.to(device), noise_level=noise_level, cond=cond, null_cond=null,
            ref_velocity_fn=lambda x, s: guided_velocity(base, x, s, base_cond, base_null, guidance),
            generator=generator,
        )
        for k in range(len(levels) - 1):
            std_k, std = sde_std(levels[k], levels[k + 1], noise_level, levels[1])
            mean = sde_mean(rollout.states[:, k], rollout.velocities[:, k], levels[k], levels[k + 1], std_k)  # (B, *X)
            kl = transition_kl(mean, rollout.ref_means[:, k], std)  # (B,)
            totals[k] += kl.double().sum().cpu()
    per_step = totals / len(prompts)
    dims = int(torch.tensor(policy.sample_shape).prod())
    return TrajectoryKL(mean=float(per_step.mean()), per_step=tuple(per_step.tolist()), path=float(per_step.sum() * dims))


def run_policies(run_dir: str | Path, checkpoint: str = "policy.safetensors") -> tuple[nn.Module, nn.Module, SDESampler]:
    """The trained policy of a `jagg_lab.train` run, the base it started from, and its sampler.

    The base is the run's policy config as written: its checkpoint, or, with
    `policy.checkpoint: null`, the random weights that training drew after seeding with the
    run's seed (train.build seeds right before it builds the policy).
    """
    run_dir = Path(run_dir)
    cfg = OmegaConf.load(run_dir / "config.yaml")
    trained_weights = run_dir / checkpoint
    if not trained_weights.is_file():
        raise FileNotFoundError(f"{trained_weights}: the run has no exported policy (did it finish?)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        base = instantiate(cfg.policy)
    policy = instantiate(cfg.policy, checkpoint=str(trained_weights))
    return policy.eval(), base.eval(), instantiate(cfg.sampler)


def policy_quality(
    policy: nn.Module,
    base: nn.Module | None,
    sampler: SDESampler,
    reference: torch.Tensor,
    *,
    n_samples: int,
    n_kl: int,
    seed: int,
    num_steps: int = 20,
    batch_size: int = 64,
) -> dict:
    """Held-out verifier scores and FID/KID of ODE samples (`num_steps` Euler steps with the
    sampler's shift and CFG scale) on `eval_prompts(n_samples, seed)`, against the reference
    renders; and, when `base` is given, the trajectory KL to it on the first `n_kl` prompts."""
    prompts = eval_prompts(n_samples, seed)
    images = sample_images(policy, prompts, seed=seed, num_steps=num_steps, guidance=sampler.guidance,
                           shift=sampler.shift, batch_size=batch_size)
    result = {**score_images(images, prompts), **fid_kid(images, reference, seed=seed)}
    if base is not None:
        kl = trajectory_kl(policy, base, prompts[:n_kl], sampler.noise_levels(), noise_level=sampler.noise_level,
                           guidance=sampler.guidance, seed=seed, batch_size=batch_size)
        result.update(kl_to_base=kl.mean, kl_to_base_path=kl.path, kl_to_base_per_step=list(kl.per_step))
    return result
