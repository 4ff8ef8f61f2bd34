"""The shared core of every gradient strategy.

All strategies compute (an estimate of) grad_theta sum_k L_k(v_theta(x_k, s_k)) and
accumulate it into `.grad` (adding, never zeroing). They differ only in how the cheap
upstream signals g_k = dL_k/dv_k are pushed back through the expensive velocity model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = [
    "flat_grad",
    "StepLossFn",
    "VelocityFn",
    "BackwardStats",
    "upstream_signal",
    "partition_windows",
    "interpolation_weights",
    "full_step_backward",
    "full_backward",
    "noise_level_batch",
    "MODES",
    "check_mode",
    "effective_mode",
]

# Where a windowed strategy gets the velocities of steps it does not backpropagate through.
MODES = ("recompute", "cached", "interpolated")

# velocity_fn(x (B, *X), s (B,)) -> v (B, *X); gradients flow to the model's parameters.
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# step_loss_fn(k, v) -> scalar loss of trained step k as a differentiable function of v.
StepLossFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass
class BackwardStats:
    """Work done by one strategy call. A 'backward pass' is one backward through the model;
    'backward items' counts the batches of B samples it carried (JAGG's joint pass carries 2)."""

    backward_passes: int = 0
    backward_items: int = 0
    grad_forwards: int = 0
    nograd_forwards: int = 0
    windows: int = 0
    jagg_windows: int = 0
    fallbacks: int = 0
    loss: float = 0.0

    def add(self, other: "BackwardStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def noise_level_batch(s: float, like: torch.Tensor) -> torch.Tensor:
    """A (B,) tensor of noise level s matching the batch, device and dtype of `like`."""
    return torch.full((like.shape[0],), s, device=like.device, dtype=like.dtype)


def upstream_signal(step_loss_fn: StepLossFn, k: int, v: torch.Tensor) -> tuple[torch.Tensor, float]:
    """g_k = dL_k/dv_k at v (autograd on the tiny loss graph, v as a leaf) and the loss value."""
    v = v.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = step_loss_fn(k, v)
        (g,) = torch.autograd.grad(loss, v, allow_unused=True)
    return (torch.zeros_like(v) if g is None else g), loss.item()


def flat_grad(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parameters' accumulated gradients as one vector (zeros where there is none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


def partition_windows(num_steps: int, window: int) -> list[list[int]]:
    """Consecutive windows of `window` steps; a leftover shorter window closes the list."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [list(range(a, min(a + window, num_steps))) for a in range(0, num_steps, window)]


def interpolation_weights(noise_levels: Sequence[float]) -> list[float]:
    """alpha_k = (s_k - s_a) / (s_b - s_a) for the steps of one window (noise level, not index)."""
    s_a, s_b = noise_levels[0], noise_levels[-1]
    if len(noise_levels) == 1:
        return [0.0]
    if s_a == s_b:
        raise ValueError("a window's endpoints must have distinct noise levels")
    return [(s - s_a) / (s_b - s_a) for s in noise_levels]


def full_step_backward(
    velocity_fn: VelocityFn, state: torch.Tensor, s: float, k: int, step_loss_fn: StepLossFn, scale: float = 1.0
) -> BackwardStats:
    """Exact gradient of one step: a forward with grad and one backward through the model."""
    v = velocity_fn(state, noise_level_batch(s, state))
    loss = step_loss_fn(k, v)
    (loss * scale).backward()
    return BackwardStats(backward_passes=1, backward_items=1, grad_forwards=1, loss=loss.item())


def check_mode(mode: str, velocities: Sequence[torch.Tensor] | None) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode != "recompute" and velocities is None:
        raise ValueError(f"mode={mode!r} needs the rollout's cached velocities (velocities=...)")


def effective_mode(mode: str, on_policy: bool) -> tuple[str, int]:
    """`cached` is exact only with the parameters that sampled the rollout; after that it
    falls back to `recompute`. Returns (mode to use, number of fallbacks to count)."""
    if mode == "cached" and not on_policy:
        return "recompute", 1
    return mode, 0


def full_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
) -> dict[str, float]:
    """Accumulate the exact gradient of sum_k L_k into .grad: K forwards with grad, K backwards."""
    stats = BackwardStats()
    for k, (state, s) in enumerate(zip(states, noise_levels)):
        stats.add(full_step_backward(velocity_fn, state, float(s), k, step_loss_fn))
    return stats.as_dict()
