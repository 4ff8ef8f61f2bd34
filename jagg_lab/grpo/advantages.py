"""Group-relative advantages: each sample is judged against the other samples of its prompt."""
from __future__ import annotations

import torch

__all__ = ["group_advantages", "expand_groups"]


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std: str = "group",
    clip_max: float = 5.0,
    eps: float = 1e-4,
) -> torch.Tensor:
    """A_i = (r_i - mean of i's group) / (std + eps), clipped to +-clip_max. All shapes (B,).

    std="group" divides by the std of each group; std="global" by the std of the whole
    batch (more stable when many groups are nearly constant). Population std (unbiased=False).
    """
    if std not in ("group", "global"):
        raise ValueError(f"advantage std must be 'group' or 'global', got {std!r}")
    rewards = rewards.float()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    counts = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, inverse, torch.ones_like(rewards))
    means = torch.zeros_like(counts).index_add_(0, inverse, rewards) / counts
    centred = rewards - means[inverse]
    if std == "group":
        var = torch.zeros_like(counts).index_add_(0, inverse, centred**2) / counts
        scale = var.sqrt()[inverse]
    else:
        scale = rewards.std(unbiased=False).expand_as(rewards)
    return (centred / (scale + eps)).clamp(-clip_max, clip_max)


def expand_groups(prompts: list[str], group_size: int, metadata: list[dict] | None = None,
                  device: torch.device | str | None = None) -> tuple[list[str], list[dict], torch.Tensor]:
    """A step's prompts as it samples them: each prompt (and its metadata, default {}) repeated
    `group_size` times in a row, and the (B,) group id of every sample."""
    metadata = [{} for _ in prompts] if metadata is None else metadata
    group_ids = torch.arange(len(prompts), device=device).repeat_interleave(group_size)
    return ([p for p in prompts for _ in range(group_size)], [m for m in metadata for _ in range(group_size)], group_ids)
