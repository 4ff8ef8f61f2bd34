"""How an SD3 / SD3.5 (MMDiT) transformer is called on the project's latents."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["SD3Adapter"]


class SD3Adapter:
    """SD3 takes latents (B, C, h, w) as they are and `timestep = s * 1000`: the pipeline passes
    the scheduler's timesteps, which are sigmas * 1000. It has no guidance embedding.

    config: the transformer's config. guidance_embed: must be None (the key exists for FLUX).
    """

    default_max_sequence_length = 256  # T5 tokens, the pipeline's default

    def __init__(self, config: Any, guidance_embed: float | None = None):
        if guidance_embed is not None:
            raise ValueError(
                f"policy.guidance_embed={guidance_embed} but this transformer has no guidance embedding; set it to null"
            )
        self.channels: int = config.in_channels
        self.sigma_spacing = "sd3"  # StableDiffusion3Pipeline's sigmas (jagg_lab.sampling.schedule)
        self.token_patch: int = config.patch_size
        # the learned positional table bounds the token grid's side
        self.max_token_side: int | None = getattr(config, "pos_embed_max_size", None)

    def velocity(
        self, transformer: nn.Module, x: torch.Tensor, s: torch.Tensor, embeds: torch.Tensor, pooled: torch.Tensor
    ) -> torch.Tensor:
        """x (B, C, h, w), s (B,), embeds (B, T, D), pooled (B, P) -> v (B, C, h, w)."""
        return transformer(
            hidden_states=x, encoder_hidden_states=embeds, pooled_projections=pooled,
            timestep=s * 1000, return_dict=False,
        )[0]

    @staticmethod
    def pipeline_class() -> type:
        from diffusers import StableDiffusion3Pipeline

        return StableDiffusion3Pipeline

    @staticmethod
    def encode_prompt(
        pipe: Any, prompts: list[str], device: torch.device, max_sequence_length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pipeline's own prompt encoding (CLIP x 2 + T5): embeds (B, T, D), pooled (B, P)."""
        embeds, _, pooled, _ = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=device, num_images_per_prompt=1,
            do_classifier_free_guidance=False, max_sequence_length=max_sequence_length,
        )
        return embeds, pooled
