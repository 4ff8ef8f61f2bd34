"""The reward interface: (images, prompts, metadata) -> scores (B,).

images: (B, 3, H, W) float in [0, 1]; prompts: B strings; metadata: B dicts.
A reward may report per-sample side values (accuracy, components) through
`components`, whose "reward" entry is the score itself; the module logs the mean of the
rest. Every entry is (B,), with NaN where a value does not apply to a sample, and the keys
do not depend on the batch's contents (processes gather them entry by entry).
"""
from __future__ import annotations

import torch

__all__ = ["Reward", "check_scores"]


class Reward:
    name: str = "reward"

    def components(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        return self.components(images, prompts, metadata)["reward"]


def check_scores(scores: torch.Tensor, batch: int, name: str) -> torch.Tensor:
    """A reward must give one finite float per image; anything else is a bug in that reward."""
    if not isinstance(scores, torch.Tensor) or scores.shape != (batch,):
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"reward {name!r} returned shape {shape}, expected ({batch},)")
    return scores.float()
