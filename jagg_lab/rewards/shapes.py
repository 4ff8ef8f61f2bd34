"""The shapes world's verifier as a GRPO reward (GenEval-style, no neural weights)."""
from __future__ import annotations

import torch

from jagg_lab.rewards.base import Reward
from jagg_lab.worlds.shapes import CATEGORIES, verify_batch

__all__ = ["ShapesVerifierReward"]


class ShapesVerifierReward(Reward):
    """reward = dense score (share of the prompt's constraints satisfied), or strict
    correctness (all satisfied) with dense=False. Logs both, and strict accuracy per category."""

    name = "shapes_verifier"

    def __init__(self, dense: bool = True):
        self.dense = dense

    def components(self, images, prompts, metadata):
        dense, strict, categories = verify_batch(images.detach().float().cpu(), prompts)
        strict = strict.float()
        out = {"reward": dense if self.dense else strict, "dense": dense, "strict": strict}
        for category in CATEGORIES:  # NaN for samples of other categories
            mask = torch.tensor([c == category for c in categories])
            out[f"strict_{category}"] = torch.where(mask, strict, torch.nan)
        return out
