"""Stateless noise-level schedule for rectified flow (s = 1 noise, s = 0 data)."""
from __future__ import annotations

import torch

__all__ = ["shift_noise_levels", "noise_schedule"]


def shift_noise_levels(s: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3's resolution shift s' = shift * s / (1 + (shift - 1) * s); shift 1 is identity."""
    return shift * s / (1 + (shift - 1) * s)


def noise_schedule(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """Noise levels s_0 = 1 > s_1 > ... > s_T = 0, linear in s then shifted. Shape (T + 1,)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return shift_noise_levels(s, shift).float()
