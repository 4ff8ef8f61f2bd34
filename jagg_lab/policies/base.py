"""What every policy offers, and classifier-free guidance on top of it.

A policy is an nn.Module with `forward(x, s, cond) -> v` (the velocity, same shape as x),
`encode_prompts(prompts) -> Cond`, `sample_shape` (the shape of one x, without batch),
and `decode(x) -> images` (B, 3, H, W) in [0, 1] for the reward.
"""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import torch

from jagg_lab.types import Cond, cat_cond, expand_cond

__all__ = ["VelocityPolicy", "guided_velocity", "guided_velocity_fn"]


@runtime_checkable
class VelocityPolicy(Protocol):
    sample_shape: tuple[int, ...]

    def __call__(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor: ...

    def encode_prompts(self, prompts: list[str]) -> Cond: ...

    def decode(self, x: torch.Tensor) -> torch.Tensor: ...


def guided_velocity(
    policy: VelocityPolicy, x: torch.Tensor, s: torch.Tensor, cond: Cond, null_cond: Cond, guidance: float
) -> torch.Tensor:
    """v_u + w (v_c - v_u), both branches in ONE batched forward; guidance 1 skips the null branch.

    x: (B, *X), s: (B,), cond: B rows, null_cond: 1 row (broadcast here).
    """
    if guidance == 1.0:
        return policy(x, s, cond)
    batch = x.shape[0]
    both = policy(torch.cat([x, x]), torch.cat([s, s]), cat_cond(cond, expand_cond(null_cond, batch)))
    v_cond, v_uncond = both[:batch], both[batch:]
    return v_uncond + guidance * (v_cond - v_uncond)


def guided_velocity_fn(
    policy: VelocityPolicy, cond: Cond, null_cond: Cond, guidance: float
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The (x, s) -> guided v closure that samplers and gradient strategies call.

    cond has B rows; x may hold n stacked copies of the B rows ((n * B, *X), e.g. JAGG's
    joint pass over its endpoints), and the conditioning is stacked to match.
    """
    rows = next(iter(cond.values())).shape[0]

    def call(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        copies, left = divmod(x.shape[0], rows)
        if left or not copies:
            raise ValueError(f"the velocity function takes whole copies of its {rows} prompt rows, got {x.shape[0]} rows")
        stacked = cond if copies == 1 else cat_cond(*([cond] * copies))
        return guided_velocity(policy, x, s, stacked, null_cond, guidance)

    return call
