"""What an evaluation samples: held-out prompts in a fixed category order, and images of any
policy from noise fixed by a seed.

Two evaluations with the same prompts count, seed, sampler settings and sample shape see the
same prompts and the same initial noise, whatever the policy: that is what lets
`jagg_lab.evaluation.paired` compare them sample by sample.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from jagg_lab.policies import VelocityPolicy, guided_velocity_fn
from jagg_lab.sampling import ode_sample, sampling_levels, sde_rollout
from jagg_lab.worlds.shapes import CATEGORIES, sample_prompt

__all__ = ["eval_categories", "eval_prompts", "sample_images"]


def eval_categories(n: int, categories: Sequence[str] | None = None) -> list[str]:
    """The category of each of `eval_prompts`' n prompts: the categories (default: all six) in
    turn, so each gets an equal share."""
    categories = check_categories(categories, "categories") if categories is not None else CATEGORIES
    return [categories[i % len(categories)] for i in range(n)]


def check_categories(categories: Sequence[str], key: str) -> tuple[str, ...]:
    """A non-empty list of shapes categories, or ValueError naming `key`."""
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown or not categories:
        raise ValueError(f"{key} must be a non-empty list from {list(CATEGORIES)}, got {list(categories)}")
    return tuple(categories)


def eval_prompts(n: int, seed: int, split: str = "heldout", categories: Sequence[str] | None = None) -> list[str]:
    """n prompts of the categories `eval_categories(n, categories)`, deterministic in seed."""
    rng = np.random.default_rng(seed)
    return [sample_prompt(rng, split, category) for category in eval_categories(n, categories)]


@torch.inference_mode()
def sample_images(
    policy: VelocityPolicy,
    prompts: list[str],
    *,
    seed: int,
    num_steps: int = 20,
    guidance: float = 3.0,
    shift: float = 1.0,
    batch_size: int = 64,
    noise_level: float = 0.0,
    on_batch: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """ODE samples with classifier-free guidance, decoded: (B, 3, H, W) in [0, 1] on the CPU.

    The grid is the policy's own (a diffusers policy's pipeline sigmas, which `shift` must then
    leave at 1 or match; the DiT's shifted uniform grid), as its rollouts sample by default.
    Any VelocityPolicy (the tiny DiT, a diffusers adapter) works: the initial noise has the
    policy's `sample_shape` and is drawn on the CPU from `seed`, so ODE samples depend neither
    on the device's random stream nor on `batch_size`. With `noise_level` > 0, samples of the
    SDE that GRPO trains with instead (its step noise drawn from the same generator after each
    batch's initial noise, so these do depend on `batch_size`). `on_batch(samples_done)` is
    called after each batch (progress; an exception it raises stops the sampling).
    """
    generator = torch.Generator().manual_seed(seed)
    # the policy's own grid, as its rollouts: a diffusers pipeline's sigmas, else shift(linspace(1, 0, T + 1))
    levels = sampling_levels(num_steps, schedule=None, shift=shift, policy=policy, key="evaluation")
    device = next(policy.parameters()).device
    null_cond = policy.encode_prompts([""])
    images = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        cond = policy.encode_prompts(chunk)
        noise = torch.randn((len(chunk), *policy.sample_shape), generator=generator).to(device)  # (b, *X)
        velocity_fn = guided_velocity_fn(policy, cond, null_cond, guidance)
        if noise_level > 0:
            x = sde_rollout(velocity_fn, noise, levels.to(device), noise_level=noise_level, cond=cond,
                            null_cond=null_cond, generator=generator).final
        else:
            x = ode_sample(velocity_fn, noise, levels.to(device))
        images.append(policy.decode(x).cpu())
        if on_batch is not None:
            on_batch(start + len(chunk))
    return torch.cat(images)
