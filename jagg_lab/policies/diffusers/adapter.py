"""One adapter per diffusers transformer family, chosen once from `policy.kind`.

The project's convention is the SD3 one: x_s = (1 - s) x0 + s eps with s = 1 noise and s = 0
data, and the network predicts v ~ eps - x0. SD3 and FLUX transformers predict exactly this
velocity; they differ only in how they are called, which is all an adapter knows.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from jagg_lab.policies.diffusers.flux import FluxAdapter
from jagg_lab.policies.diffusers.sd3 import SD3Adapter

__all__ = ["TransformerAdapter", "ADAPTERS", "KINDS", "adapter_class"]


class TransformerAdapter(Protocol):
    """Latent geometry and the forward call of one transformer family.

    channels: latent channels C of x (B, C, h, w). token_patch: latent cells per token side.
    max_token_side: the largest token grid side the transformer accepts (None: unbounded).
    sigma_spacing: how the family's pipeline spaces its sigmas ("sd3" or "flux", see
    `jagg_lab.sampling.schedule`).
    """

    channels: int
    token_patch: int
    sigma_spacing: str
    max_token_side: int | None
    default_max_sequence_length: int

    def __init__(self, config: Any, guidance_embed: float | None = None): ...

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, s: torch.Tensor, embeds: torch.Tensor, pooled: torch.Tensor
    ) -> torch.Tensor: ...

    @staticmethod
    def pipeline_class() -> type: ...

    @staticmethod
    def encode_prompt(
        pipe: Any, prompts: list[str], device: torch.device, max_sequence_length: int
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


ADAPTERS: dict[str, type[TransformerAdapter]] = {"sd3": SD3Adapter, "flux": FluxAdapter}
KINDS = tuple(ADAPTERS)


def adapter_class(kind: str) -> type[TransformerAdapter]:
    if kind not in ADAPTERS:
        raise ValueError(f"policy.kind must be one of {list(KINDS)}, got {kind!r}")
    return ADAPTERS[kind]
