"""Tiny random-config SD3 and FLUX transformers, a tiny VAE and a stub prompt encoder (no weights, no hub).

Every test name in this folder carries sd3 or flux (directly or through its parameter id), so
`pytest -k "sd3 or flux"` selects them.
"""
from __future__ import annotations

import hashlib

import torch
from diffusers import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel

from jagg_lab.policies.diffusers import SD3_LORA_TARGETS, DiffusersPolicy

KINDS = ["sd3", "flux"]
SD3_CONFIG = dict(
    sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=32, num_attention_heads=4,
    joint_attention_dim=64, caption_projection_dim=128, pooled_projection_dim=64, out_channels=4,
)
FLUX_CONFIG = dict(
    patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False, axes_dims_rope=(4, 4, 8),
)
TEXT_SHAPES = {"sd3": (6, 64, 64), "flux": (6, 32, 32)}  # prompt tokens, embedding dim, pooled dim
RESOLUTION = 16  # pixels; the tiny VAE halves it: latents (4, 8, 8)


class StubEncoder:
    """Deterministic per-prompt embeddings of the right shapes; counts what it encodes."""

    def __init__(self, tokens: int, dim: int, pooled: int):
        self.tokens, self.dim, self.pooled = tokens, dim, pooled
        self.encoded: list[str] = []

    def __call__(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        self.encoded += prompts
        rows = []
        for p in prompts:
            g = torch.Generator().manual_seed(int(hashlib.sha256(p.encode()).hexdigest()[:8], 16))
            rows.append((torch.randn(self.tokens, self.dim, generator=g), torch.randn(self.pooled, generator=g)))
        return {"prompt_embeds": torch.stack([r[0] for r in rows]), "pooled": torch.stack([r[1] for r in rows])}


def tiny_transformer(kind: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    if kind == "sd3":
        return SD3Transformer2DModel(**{**SD3_CONFIG, **overrides})
    return FluxTransformer2DModel(**{**FLUX_CONFIG, **overrides})


def tiny_vae(seed: int = 0) -> AutoencoderKL:
    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=RESOLUTION,
        scaling_factor=1.5, shift_factor=0.1,
    )


def tiny_policy(kind: str, *, lora: bool = True, seed: int = 0, transformer=None, **kwargs) -> DiffusersPolicy:
    kwargs.setdefault("resolution", RESOLUTION)
    kwargs.setdefault("scheduler_config", {"shift": 3.0})  # SD3.5's scheduler: the pipeline grid at shift 3
    return DiffusersPolicy(
        kind, transformer or tiny_transformer(kind, seed), tiny_vae(seed), StubEncoder(*TEXT_SHAPES[kind]),
        lora_rank=4, lora_alpha=8, lora_target_modules=SD3_LORA_TARGETS if lora else None, **kwargs,
    )


def activate_lora(policy: DiffusersPolicy, seed: int = 1, std: float = 0.05) -> None:
    """LoRA B starts at zero, which leaves A without gradient; small random B exercises both."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def inputs(policy: DiffusersPolicy, batch: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, *policy.sample_shape), generator=g)
    s = torch.rand(batch, generator=g)
    return x, s, policy.encode_prompts(["a red circle", "two squares", "a red circle"][:batch])
