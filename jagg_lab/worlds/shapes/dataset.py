"""Pretraining data for the shapes world: (ground-truth image, prompt) pairs.

Sampling: category uniform over CATEGORIES, then a prompt of the split within it. Colours
are balanced: unconstrained colours are uniform (see ``sample_scene``), and for the
colour-naming categories (colors, color_attr) prompts are reweighted so that every colour is
named equally often - the hash split removes an uneven number of prompts per colour, and a
previous model drifted towards the majority colour.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from jagg_lab.worlds.shapes.constraints import CATEGORIES
from jagg_lab.worlds.shapes.grammar import all_prompts, parse, sample_scene
from jagg_lab.worlds.shapes.scene import COLORS, Scene, render

__all__ = ["ShapesDataset", "color_balanced_weights", "render_batch", "to_unit_tensor"]

_BALANCE_ITERS = 200


def color_balanced_weights(prompts: tuple[str, ...]) -> np.ndarray:
    """Sampling probabilities [len(prompts)] under which every colour is named equally often
    (iterative proportional fitting; uniform if no prompt names a colour)."""
    counts = np.zeros((len(prompts), len(COLORS)))
    for i, p in enumerate(prompts):
        for o in parse(p).objects:
            if o.color is not None:
                counts[i, COLORS.index(o.color)] += 1
    weights = np.ones(len(prompts))
    named = counts.sum(axis=1) > 0
    if not named.any():
        return weights / weights.sum()
    for _ in range(_BALANCE_ITERS):
        mentions = weights @ counts  # expected mentions per colour [C]
        present = mentions > 0
        factor = np.ones(len(COLORS))
        factor[present] = mentions[present].mean() / mentions[present]
        # Each prompt moves by the geometric mean of its colours' correction factors.
        weights[named] *= np.exp((counts[named] @ np.log(factor)) / counts[named].sum(axis=1))
        weights /= weights.sum()
    return weights


@lru_cache(maxsize=64)
def _pool(split: str, category: str) -> tuple[tuple[str, ...], np.ndarray]:
    prompts = tuple(all_prompts(split, category))
    return prompts, color_balanced_weights(prompts)


def to_unit_tensor(image: np.ndarray) -> torch.Tensor:
    """uint8 [H, W, 3] -> float32 [3, H, W] in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div_(255.0)


def render_batch(prompts: list[str], rng: np.random.Generator, resolution: int = 32) -> torch.Tensor:
    """One random ground-truth image per prompt: float32 [B, 3, H, W] in [0, 1]."""
    if len(prompts) == 0:
        return torch.empty((0, 3, resolution, resolution))
    return torch.stack([to_unit_tensor(render(sample_scene(parse(p), rng, resolution))) for p in prompts])


class ShapesDataset(IterableDataset):
    """Endless (or ``num_samples``-long) stream of ``{"image": float32 [3, H, W] in [-1, 1],
    "prompt": str, "category": str}`` from ``split``.

    Deterministic given ``seed``: each (rank, DataLoader worker) pair gets its own
    ``SeedSequence([seed, rank, worker_id])`` stream, so workers never duplicate samples and
    a rerun with the same seed and worker count reproduces the data exactly. With
    ``num_samples`` set, the samples are divided among the workers of this rank.
    """

    def __init__(
        self,
        resolution: int = 32,
        seed: int = 0,
        split: str = "train",
        num_samples: int | None = None,
        rank: int = 0,
    ) -> None:
        super().__init__()
        self.resolution = resolution
        self.seed = seed
        self.split = split
        self.num_samples = num_samples
        self.rank = rank
        for category in CATEGORIES:
            if not _pool(split, category)[0]:
                raise ValueError(f"split {split!r} has no {category} prompts")

    def sample(self, rng: np.random.Generator) -> tuple[str, str, Scene]:
        """One ``(prompt, category, scene)`` drawn with this dataset's sampling rules."""
        category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        prompts, weights = _pool(self.split, category)
        prompt = prompts[int(rng.choice(len(prompts), p=weights))]
        return prompt, category, sample_scene(parse(prompt), rng, self.resolution)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor | str]]:
        info = get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.rank, worker_id]))
        if self.num_samples is None:
            remaining = -1  # never reaches 0: endless stream
        else:
            remaining = self.num_samples // num_workers + int(worker_id < self.num_samples % num_workers)
        while remaining != 0:
            prompt, category, scene = self.sample(rng)
            image = to_unit_tensor(render(scene)).mul_(2.0).sub_(1.0)
            yield {"image": image, "prompt": prompt, "category": category}
            remaining -= 1
