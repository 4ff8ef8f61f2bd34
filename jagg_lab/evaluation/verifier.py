"""Verifier scores of images against their prompts: the shapes world's held-out accuracy."""
from __future__ import annotations

import torch

from jagg_lab.worlds.shapes import CATEGORIES, verify_batch

__all__ = ["score_images"]


def score_images(images: torch.Tensor, prompts: list[str]) -> dict:
    """strict_accuracy, dense_score, both per category, and per sample (in prompt order, so two
    policies scored on the same prompts and seed can be compared sample by sample).

    images: (B, 3, H, W) in [0, 1], one per prompt.
    """
    dense, strict, categories = verify_batch(images, prompts)
    result = {"n_samples": len(prompts), "strict_accuracy": strict.float().mean().item(), "dense_score": dense.mean().item(),
              "per_sample": {"strict": strict.int().tolist(), "dense": dense.tolist()}, "per_category": {}}
    for category in CATEGORIES:
        mask = torch.tensor([c == category for c in categories])
        if mask.any():
            result["per_category"][category] = {
                "n": int(mask.sum()),
                "strict_accuracy": strict[mask].float().mean().item(),
                "dense_score": dense[mask].mean().item(),
            }
    return result
