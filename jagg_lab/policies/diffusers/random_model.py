"""SD3.5-Medium's transformer with random weights and random prompt embeddings of SD3's shapes:
the real model's compute and memory for GPU timing, with no weights to download."""
from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from jagg_lab.types import Cond

__all__ = ["SD35_MEDIUM_TRANSFORMER", "SD35_MEDIUM_SCHEDULER", "SD3_TEXT_LENGTH", "RandomPromptEncoder",
           "sd35_medium_transformer"]

# `transformer/config.json` of stabilityai/stable-diffusion-3.5-medium (2.5B parameters):
# 24 MMDiT-X blocks of width 24 x 64 = 1536, the first 13 with a second (image-only) attention.
SD35_MEDIUM_TRANSFORMER: dict[str, Any] = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 384,
    "dual_attention_layers": tuple(range(13)),
    "qk_norm": "rms_norm",
}
# `scheduler/scheduler_config.json` of the same pipeline: its sampling grid (static shift 3).
SD35_MEDIUM_SCHEDULER: dict[str, Any] = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000,
                                         "shift": 3.0}
# SD3's prompt sequence: 77 CLIP tokens followed by 256 T5 tokens (pipeline default).
SD3_TEXT_LENGTH = 77 + 256


class RandomPromptEncoder:
    """Fixed random embeddings of SD3's shapes, for timing without text encoders: each prompt's
    embedding is seeded by its text (stable across processes), so equal prompts agree."""

    def __init__(self, text_length: int, embed_dim: int, pooled_dim: int):
        self.text_length, self.embed_dim, self.pooled_dim = text_length, embed_dim, pooled_dim

    def __call__(self, prompts: list[str]) -> Cond:
        embeds, pooled = [], []
        for prompt in prompts:
            seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:7], "little")
            generator = torch.Generator().manual_seed(seed)
            embeds.append(torch.randn(self.text_length, self.embed_dim, generator=generator))  # (T, D)
            pooled.append(torch.randn(self.pooled_dim, generator=generator))  # (P,)
        return {"prompt_embeds": torch.stack(embeds), "pooled": torch.stack(pooled)}


def sd35_medium_transformer(
    num_layers: int, pos_embed_max_size: int, seed: int, dtype: torch.dtype, device: str | None
) -> nn.Module:
    """SD3.5-Medium's transformer with its first `num_layers` blocks (the first min(13,
    num_layers) keep dual attention), random weights from `seed`, created directly in `dtype`
    on `device` (None = CPU; the GPU initialises 2.5B weights far faster)."""
    from diffusers import SD3Transformer2DModel

    config = dict(SD35_MEDIUM_TRANSFORMER)
    config.update(
        num_layers=num_layers,
        dual_attention_layers=tuple(i for i in config["dual_attention_layers"] if i < num_layers),
        pos_embed_max_size=pos_embed_max_size,
    )
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device or "cpu"):
            return SD3Transformer2DModel(**config)
    finally:
        torch.set_default_dtype(previous)
