"""The `data/` config group: which prompts GRPO trains on, and how they are grouped."""
from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, IterableDataset

from jagg_lab.evaluation.samples import check_categories
from jagg_lab.worlds.shapes import parse, sample_prompt

__all__ = ["PromptDataModule", "read_prompt_file"]


def read_prompt_file(path: str | Path) -> list[str]:
    """One prompt per line; blank lines and lines starting with '#' are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data.prompt_file: no such file {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"data.prompt_file {path} is not UTF-8 text: {err}") from err
    prompts = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not prompts:
        raise ValueError(f"data.prompt_file {path} holds no prompts")
    return prompts


class _PromptStream(IterableDataset):
    """An endless stream of prompt batches (P prompts each). Batch i depends only on (seed, i),
    so a resumed run continues the stream exactly where the checkpoint left it."""

    def __init__(self, module: "PromptDataModule"):
        self.module = module

    def __iter__(self):
        index = self.module.start_index
        while True:
            prompts = self.module.draw(np.random.default_rng([self.module.seed, index]))
            yield {"index": index, "prompts": prompts, "metadata": [self.module.metadata(p) for p in prompts]}
            index += 1


class PromptDataModule(L.LightningDataModule):
    """source: "shapes" (the embedded world's grammar) or "file" (prompt_file, one per line).

    split: the shapes world split to draw from ("train" or "heldout").
    categories: the shapes categories to draw from, each equally often (null: all of CATEGORIES,
    as held-out evaluation does); the prompt mix GRPO trains on.
    prompts_per_step: P distinct prompts per rollout; group_size: G samples per prompt,
    so a rollout has P * G samples, split into micro-batches by the module.
    """

    def __init__(
        self,
        source: str = "shapes",
        split: str = "train",
        prompt_file: str | None = None,
        prompts_per_step: int = 8,
        group_size: int = 8,
        seed: int = 0,
        categories: list[str] | None = None,
    ):
        super().__init__()
        if source not in ("shapes", "file"):
            raise ValueError(f"data.source must be 'shapes' or 'file', got {source!r}")
        if source == "file" and not prompt_file:
            raise ValueError("data.source=file needs data.prompt_file")
        if split not in ("train", "heldout"):
            raise ValueError(f"data.split must be 'train' or 'heldout', got {split!r}")
        if group_size < 2:
            raise ValueError(f"data.group_size must be >= 2 (advantages compare samples of a prompt), got {group_size}")
        if prompts_per_step < 1:
            raise ValueError(f"data.prompts_per_step must be >= 1, got {prompts_per_step}")
        if categories is not None:
            if source != "shapes":
                raise ValueError("data.categories picks shapes categories; it needs data.source=shapes")
        self.categories = None if categories is None else check_categories(categories, "data.categories")
        self.source = source
        self.split = split
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.seed = seed
        self.start_index = 0  # first batch of the stream; set from a checkpoint on resume
        self.file_prompts = read_prompt_file(prompt_file) if source == "file" else None

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def draw(self, rng: np.random.Generator) -> list[str]:
        if self.file_prompts is not None:
            return [self.file_prompts[i] for i in rng.integers(0, len(self.file_prompts), self.prompts_per_step)]
        if self.categories is None:
            return [sample_prompt(rng, self.split) for _ in range(self.prompts_per_step)]
        return [sample_prompt(rng, self.split, self.categories[int(rng.integers(len(self.categories)))])
                for _ in range(self.prompts_per_step)]

    def metadata(self, prompt: str) -> dict:
        return {"category": parse(prompt).category} if self.source == "shapes" else {}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_PromptStream(self), batch_size=None, num_workers=0)
