"""Captioned sample grids: one row per prompt group, the prompt on the left, each sample with
its reward underneath. Written as `samples/step_<step>.png` with `step_<step>.txt` (every
sample's group, prompt and reward, for prompts too long for the picture) and sent to the
image-capable loggers (TensorBoard, W&B).

The module decides when (every `sample_every` rollouts) and leaves the rollout's images and
rewards, gathered from all ranks, in `pl_module.grid_samples`; this callback draws them.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from PIL import Image, ImageDraw, ImageFont

__all__ = ["SampleGrids", "captioned_grid"]

MAX_GROUPS, MAX_PER_GROUP = 8, 8
TILE, CAPTION_WIDTH, LINE, PAD = 96, 240, 14, 4
CAPTION_CHARS, CAPTION_LINES = 34, 5


def _caption(index: int, prompt: str) -> str:
    lines = textwrap.wrap(f"[{index}] {prompt}", CAPTION_CHARS) or [f"[{index}]"]
    if len(lines) > CAPTION_LINES:  # the full prompt is in the .txt next to the grid
        lines = lines[:CAPTION_LINES]
        lines[-1] = lines[-1][: CAPTION_CHARS - 1] + "…"
    return "\n".join(lines)


def captioned_grid(images: torch.Tensor, prompts: list[str], rewards: torch.Tensor, group_size: int) -> Image.Image:
    """images: (P * G, 3, H, W) in [0, 1], grouped by prompt; prompts: the P prompts;
    rewards: (P * G,). At most 8 groups of 8 samples are drawn."""
    groups = min(len(prompts), MAX_GROUPS)
    shown = min(group_size, MAX_PER_GROUP)
    font = ImageFont.load_default(size=11)
    row_h = TILE + LINE + PAD
    grid = Image.new("RGB", (CAPTION_WIDTH + shown * (TILE + PAD) + PAD, groups * row_h + PAD), "white")
    draw = ImageDraw.Draw(grid)
    pixels = (images.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()  # (N, H, W, 3)
    for g in range(groups):
        top = PAD + g * row_h
        draw.multiline_text((PAD, top), _caption(g, prompts[g]), fill="black", font=font, spacing=2)
        for j in range(shown):
            i = g * group_size + j
            left = CAPTION_WIDTH + j * (TILE + PAD)
            grid.paste(Image.fromarray(np.ascontiguousarray(pixels[i])).resize((TILE, TILE), Image.NEAREST), (left, top))
            draw.text((left, top + TILE + 1), f"{rewards[i].item():.3f}", fill="black", font=font)
    return grid


class SampleGrids(Callback):
    """run_dir: where `samples/` goes. Does nothing on ranks other than 0."""

    def __init__(self, run_dir: str | Path):
        self.out = Path(run_dir) / "samples"

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        samples = getattr(pl_module, "grid_samples", None)
        pl_module.grid_samples = None
        if samples is None or not trainer.is_global_zero:
            return
        images, rewards = samples
        prompts, group_size = batch["prompts"], len(images) // len(batch["prompts"])
        grid = captioned_grid(images, prompts, rewards, group_size)
        name = f"step_{trainer.global_step:06d}"
        self.out.mkdir(parents=True, exist_ok=True)
        grid.save(self.out / f"{name}.png")
        rows = [f"{i // group_size}\t{rewards[i].item():.4f}\t{prompts[i // group_size]}" for i in range(len(images))]
        (self.out / f"{name}.txt").write_text("group\treward\tprompt\n" + "\n".join(rows) + "\n")
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_image("samples", np.asarray(grid), trainer.global_step, dataformats="HWC")
            elif isinstance(logger, WandbLogger):
                logger.log_image(key="samples", images=[grid], step=trainer.global_step)
