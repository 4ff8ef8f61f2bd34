"""A small DiT velocity model for pixel-space text-to-image flow matching.

Image patches and prompt tokens share one sequence (joint attention, as in SD3's MMDiT
but with shared weights); the noise level and pooled prompt condition every block by
adaLN-Zero. Image positions use a fixed 2D sin-cos embedding: a learned one initialised
small leaves patches independent of their neighbours for a long time (patch confetti).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["DiTConfig", "DiT", "TextEncoder", "DIT_SIZES"]

# name -> (width, depth, heads, text_depth)
DIT_SIZES: dict[str, dict[str, int]] = {
    "XS": dict(width=64, depth=2, heads=2, text_depth=1),
    "S": dict(width=128, depth=6, heads=4, text_depth=2),
    "B": dict(width=256, depth=8, heads=8, text_depth=2),
}


@dataclass(frozen=True)
class DiTConfig:
    vocab_size: int
    max_text_length: int
    resolution: int = 32
    channels: int = 3
    patch_size: int = 4
    width: int = 128
    depth: int = 6
    heads: int = 4
    text_depth: int = 2
    prediction: str = "x"  # "x": predict x0, return v = (x - x0) / s; "v": predict v directly
    min_noise_level: float = 0.05  # s is clamped here when converting an x-prediction to v

    def __post_init__(self) -> None:
        for key in ("resolution", "channels", "patch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"policy.{key} must be >= 1, got {getattr(self, key)}")
        if self.resolution % self.patch_size:
            raise ValueError(
                f"policy.resolution ({self.resolution}) must be divisible by policy.patch_size ({self.patch_size})"
            )
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be divisible by heads {self.heads}")
        if self.prediction not in ("x", "v"):
            raise ValueError(f"policy.prediction must be 'x' or 'v', got {self.prediction!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def sincos_2d(width: int, grid: int) -> torch.Tensor:
    """Fixed 2D sin-cos position embedding, (grid * grid, width)."""
    quarter = width // 4
    freqs = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    coords = torch.arange(grid, dtype=torch.float64)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    parts = []
    for pos in (yy.flatten(), xx.flatten()):
        angles = pos[:, None] * freqs[None]
        parts += [angles.sin(), angles.cos()]
    emb = torch.cat(parts, 1)
    return F.pad(emb, (0, width - emb.shape[1])).float()


def noise_level_embedding(s: torch.Tensor, dim: int = 256) -> torch.Tensor:
    """Sinusoidal features of 1000 * s (DiT's timestep embedding), (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=s.device, dtype=torch.float32) / half)
    angles = 1000 * s.float()[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], 1)


def modulate(h: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return h * (1 + scale) + shift


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention, (B, heads, N, D/heads). Under CPU autocast it runs in
    float32: at these head sizes the CPU's bfloat16 attention backward took about 4x the
    float32 one, while the projections around it gain most from bfloat16."""
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    return F.scaled_dot_product_attention(q, k, v)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))
        # adaLN-Zero: each block starts as the identity.
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        batch, length, width = h.shape  # (B, N, D)
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c)[:, None].chunk(6, -1)
        qkv = self.qkv(modulate(self.norm1(h), shift1, scale1))
        q, k, v = qkv.view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attn = attention(q, k, v).transpose(1, 2).reshape(batch, length, width)
        h = h + gate1 * self.proj(attn)
        return h + gate2 * self.mlp(modulate(self.norm2(h), shift2, scale2))


class TextEncoder(nn.Module):
    """Token ids (B, L) -> tokens (B, L + 1, D) with a leading summary token, and pooled (B, D).

    The summary token is never padding, so the null prompt (all padding) is well defined.
    """

    def __init__(self, vocab_size: int, max_length: int, width: int, depth: int, heads: int):
        super().__init__()
        self.summary_id = vocab_size
        self.embed = nn.Embedding(vocab_size + 1, width)
        self.pos = nn.Parameter(torch.randn(1, max_length + 1, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        summary = torch.full((ids.shape[0], 1), self.summary_id, dtype=ids.dtype, device=ids.device)
        h = self.embed(torch.cat([summary, ids], 1)) + self.pos[:, : ids.shape[1] + 1]
        h = self.norm(self.encoder(h))  # (B, L + 1, D)
        return {"tokens": h, "pooled": h[:, 0]}


class DiT(nn.Module):
    """v(x, s, cond): x (B, C, H, W), s (B,), cond {"tokens": (B, L, D), "pooled": (B, D)} -> (B, C, H, W)."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        c, p, d = config.channels, config.patch_size, config.width
        self.grid = config.resolution // p
        self.patch = nn.Conv2d(c, d, p, stride=p)
        self.register_buffer("pos", sincos_2d(d, self.grid)[None], persistent=False)
        self.noise_mlp = nn.Sequential(nn.Linear(256, d), nn.SiLU(), nn.Linear(d, d))
        self.text_proj = nn.Linear(d, d)
        self.pooled_proj = nn.Linear(d, d)
        self.blocks = nn.ModuleList(Block(d, config.heads) for _ in range(config.depth))
        self.final_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.final = nn.Linear(d, p * p * c)
        for module in (self.final_ada[1], self.final):
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor, s: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        cfg = self.config
        batch = x.shape[0]
        h_img = self.patch(x).flatten(2).transpose(1, 2) + self.pos  # (B, N, D)
        h_txt = self.text_proj(cond["tokens"])  # (B, L, D)
        c = self.noise_mlp(noise_level_embedding(s)) + self.pooled_proj(cond["pooled"])  # (B, D)
        h = torch.cat([h_txt, h_img], 1)
        for block in self.blocks:
            h = block(h, c)
        h = h[:, h_txt.shape[1] :]
        shift, scale = self.final_ada(c)[:, None].chunk(2, -1)
        # float32 from here on under autocast too: the x-prediction's division by s amplifies rounding.
        out = self.final(modulate(self.final_norm(h), shift, scale)).float()  # (B, N, p*p*C)
        p, g = cfg.patch_size, self.grid
        out = out.view(batch, g, g, p, p, cfg.channels).permute(0, 5, 1, 3, 2, 4).reshape(x.shape)
        if cfg.prediction == "v":
            return out
        # x-prediction: the network denoises, the velocity follows from x_s = (1 - s) x0 + s eps.
        s_safe = s.clamp_min(cfg.min_noise_level).view(-1, *([1] * (x.dim() - 1)))
        return (x - out) / s_safe
