"""DDPO's JPEG (in)compressibility rewards: file size of the image encoded as JPEG."""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from jagg_lab.rewards.base import Reward

__all__ = ["jpeg_size_kb", "JpegCompressibility"]


def jpeg_size_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """Encoded JPEG size in kB of each image (B, 3, H, W) in [0, 1]. (B,)"""
    arrays = (images.detach().float().clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()
    sizes = []
    for array in arrays:
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegCompressibility(Reward):
    """reward = -size_kB (compressibility) or +size_kB (incompressible=True)."""

    def __init__(self, quality: int = 95, incompressible: bool = False):
        if not 1 <= quality <= 100:
            raise ValueError(f"reward.quality must be in [1, 100], got {quality}")
        self.quality = quality
        self.sign = 1.0 if incompressible else -1.0
        self.name = "jpeg_incompressibility" if incompressible else "jpeg_compressibility"

    def components(self, images, prompts, metadata):
        size = jpeg_size_kb(images, self.quality)
        return {"reward": self.sign * size, "jpeg_kb": size}
