"""How a FLUX.1 transformer is called on the project's latents: 2x2 packing, position ids, guidance."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["FluxAdapter", "pack_latents", "unpack_latents", "flux_image_ids"]


def pack_latents(x: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/2 * w/2, 4C): FLUX's 2x2 patch tokens (FluxPipeline._pack_latents)."""
    b, c, h, w = x.shape
    x = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, h/2 * w/2, 4C) -> (B, C, h, w), the inverse of `pack_latents`."""
    b, _, d = tokens.shape
    x = tokens.view(b, h // 2, w // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, d // 4, h, w)


def flux_image_ids(h: int, w: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Position ids (h/2 * w/2, 3) of the packed image tokens: (0, row, col), as the pipeline."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3).to(device)


class FluxAdapter:
    """FLUX takes 2x2-packed latents (B, h/2 * w/2, 4C) and `timestep = s` (the pipeline passes
    t / 1000; the model multiplies by 1000 itself), position ids for image and text tokens, and,
    for guidance-distilled checkpoints (FLUX.1-dev), a guidance value.

    config: the transformer's config. guidance_embed: the guidance value; required exactly when
    the transformer has a guidance embedding.
    """

    default_max_sequence_length = 512  # T5 tokens, the pipeline's default

    def __init__(self, config: Any, guidance_embed: float | None = None):
        has_guidance = bool(getattr(config, "guidance_embeds", False))
        if has_guidance and guidance_embed is None:
            raise ValueError(
                "policy.guidance_embed must be set: this FLUX transformer has a guidance embedding (FLUX.1-dev uses 3.5)"
            )
        if guidance_embed is not None and not has_guidance:
            raise ValueError(
                f"policy.guidance_embed={guidance_embed} but this transformer has no guidance embedding; set it to null"
            )
        self.guidance_embed = guidance_embed
        self.channels: int = config.in_channels // 4  # a token holds a 2x2 patch of latent cells
        self.token_patch = 2
        self.sigma_spacing = "flux"  # FluxPipeline's sigmas: linspace(1, 1/T, T), then (dynamic) shift
        self.max_token_side: int | None = None  # rotary positions: no table to outgrow
        self._image_ids: dict[tuple, torch.Tensor] = {}  # (h, w, device) -> (h/2 * w/2, 3)

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, s: torch.Tensor, embeds: torch.Tensor, pooled: torch.Tensor
    ) -> torch.Tensor:
        """x (B, C, h, w), s (B,), embeds (B, T, D), pooled (B, P) -> v (B, C, h, w)."""
        h, w = x.shape[-2:]
        guidance = None
        if self.guidance_embed is not None:
            guidance = torch.full((x.shape[0],), float(self.guidance_embed), device=x.device)
        out = transformer(
            hidden_states=pack_latents(x), encoder_hidden_states=embeds, pooled_projections=pooled,
            timestep=s, guidance=guidance, img_ids=self.image_ids(h, w, x.device),
            txt_ids=torch.zeros(embeds.shape[1], 3, device=x.device), return_dict=False,
        )[0]  # (B, h/2 * w/2, 4C)
        return unpack_latents(out, h, w)

    def image_ids(self, h: int, w: int, device: torch.device) -> torch.Tensor:
        key = (h, w, str(device))
        if key not in self._image_ids:
            self._image_ids[key] = flux_image_ids(h, w, device)
        return self._image_ids[key]

    @staticmethod
    def pipeline_class() -> type:
        from diffusers import FluxPipeline

        return FluxPipeline

    @staticmethod
    def encode_prompt(
        pipe: Any, prompts: list[str], device: torch.device, max_sequence_length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pipeline's own prompt encoding (CLIP pooled + T5): embeds (B, T, D), pooled (B, P)."""
        embeds, pooled, _ = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=1,
            max_sequence_length=max_sequence_length,
        )
        return embeds, pooled
