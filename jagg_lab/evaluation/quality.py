"""How good a trained policy is, and how far it moved from its base, in one call: held-out
verifier accuracy, FID/KID against the world's renders, and the trajectory KL to the base.

What experiments/quality.py writes to each run's eval.json::

    policy, base, sampler = run_policies("outputs/runs/RUN")
    policy_quality(policy, base, sampler, reference_images(128, seed=2), n_samples=128, n_kl=32, seed=1)
"""
from __future__ import annotations

import torch

from jagg_lab.evaluation.fid import fid_kid
from jagg_lab.evaluation.kl import trajectory_kl
from jagg_lab.evaluation.samples import eval_prompts, sample_images
from jagg_lab.evaluation.verifier import score_images
from jagg_lab.policies import VelocityPolicy
from jagg_lab.sampling import SDESampler

__all__ = ["policy_quality"]


def policy_quality(
    policy: VelocityPolicy,
    base: VelocityPolicy | None,
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
        kl = trajectory_kl(policy, base, prompts[:n_kl], sampler.noise_levels(policy), noise_level=sampler.noise_level,
                           guidance=sampler.guidance, seed=seed, batch_size=batch_size)
        result.update(kl_to_base=kl.mean, kl_to_base_path=kl.path, kl_to_base_per_step=list(kl.per_step))
    return result
