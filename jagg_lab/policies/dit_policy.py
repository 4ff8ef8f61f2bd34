"""The default policy: a tokenizer, a small text encoder and a DiT, in pixel space."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from jagg_lab.checkpointing import load_checkpoint
from jagg_lab.policies.dit import DIT_SIZES, DiT, DiTConfig, TextEncoder
from jagg_lab.types import Cond
from jagg_lab.worlds.shapes import Tokenizer

__all__ = ["DiTPolicy", "SHIPPED_CHECKPOINT", "fill_zero_init_"]

log = logging.getLogger(__name__)

SHIPPED_CHECKPOINT = Path(__file__).resolve().parent.parent / "assets" / "shapes_dit_s.safetensors"


def fill_zero_init_(module: nn.Module, seed: int = 0, std: float = 0.05) -> nn.Module:
    """Give every all-zero parameter random values (in place).

    adaLN-Zero starts each block as the identity and the output layer at zero, so a fresh
    DiT's velocity is x-affine and most parameters get no gradient: useless for measuring
    gradient estimators. Benchmarks and tests without a trained checkpoint use this instead.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.abs().max() == 0:
                scale = std if p.dim() > 1 else std / 2
                p.copy_(torch.randn(p.shape, generator=generator) * scale)
    return module


class DiTPolicy(nn.Module):
    """v(x, s, cond) on images in [-1, 1]; prompts are encoded by a jointly trained text encoder.

    size: a DIT_SIZES key. checkpoint: a safetensors file written by `save`, a training
    checkpoint (`.ckpt`, its policy weights), "shipped" for the base policy in the package, or
    None for random init. train_text_encoder: whether RL also
    updates the text encoder (off by default: its outputs are then computed once per rollout).
    """

    def __init__(
        self,
        size: str = "S",
        resolution: int = 32,
        channels: int = 3,
        patch_size: int = 4,
        prediction: str = "x",
        checkpoint: str | None = None,
        train_text_encoder: bool = False,
    ):
        super().__init__()
        if size not in DIT_SIZES:
            raise ValueError(f"policy.size must be one of {sorted(DIT_SIZES)}, got {size!r}")
        self.tokenizer = Tokenizer()
        dims = DIT_SIZES[size]
        self.config = DiTConfig(
            vocab_size=self.tokenizer.vocab_size,
            max_text_length=self.tokenizer.max_length,
            resolution=resolution,
            channels=channels,
            patch_size=patch_size,
            prediction=prediction,
            **dims,
        )
        self.size = size
        self.text_encoder = TextEncoder(
            self.tokenizer.vocab_size, self.tokenizer.max_length, dims["width"], dims["text_depth"], dims["heads"]
        )
        self.dit = DiT(self.config)
        if checkpoint is not None:
            self.load(SHIPPED_CHECKPOINT if checkpoint == "shipped" else Path(checkpoint))
        self.text_encoder.requires_grad_(train_text_encoder)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (self.config.channels, self.config.resolution, self.config.resolution)

    def validate_prompts(self, prompts: list[str]) -> None:
        """Raise ValueError naming the first word outside the tokenizer's vocabulary."""
        self.tokenizer.encode_batch(prompts)

    def encode_prompts(self, prompts: list[str]) -> Cond:
        device = next(self.parameters()).device
        # The frozen encoder runs once per rollout: float32 under autocast too, so the
        # conditioning is the same whatever precision the DiT computes in.
        with torch.autocast(device.type, enabled=False):
            return self.text_encoder(self.tokenizer.encode_batch(prompts).to(device))

    def forward(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        return self.dit(x, s, cond)

    def shard_modules(self) -> list[nn.Module]:
        """What FSDP shards, one unit each, inner ones first (`jagg_lab.sharding`): every DiT
        block, the rest of the DiT, the text encoder."""
        return [*self.dit.blocks, self.dit, self.text_encoder]

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Samples in [-1, 1] -> images (B, 3, H, W) in [0, 1]."""
        return ((x.float().clamp(-1, 1) + 1) / 2)

    def save(self, path: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Write the weights (`state`: these instead of `state_dict()`, e.g. a sharded policy's gathered ones)."""
        meta = {"config": json.dumps(self.config.to_dict()), "size": self.size}
        state = self.state_dict() if state is None else state
        save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=meta)
        # safetensors writes through a private temporary file, which leaves the file 0600: give it
        # the mode a newly created file gets (0666 less the umask), as every other run output has.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)

    def load(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"policy.checkpoint: no such file {path}")
        if path.suffix == ".ckpt":  # a training checkpoint: the GRPO module's policy weights, loaded without running code
            module_state = load_checkpoint(path, "policy.checkpoint")["state_dict"]
            saved, state = {}, {k.removeprefix("policy."): v for k, v in module_state.items() if k.startswith("policy.")}
        else:
            try:
                with safe_open(str(path), framework="pt") as f:
                    saved = json.loads((f.metadata() or {}).get("config", "{}"))
                state = load_file(str(path))
            except Exception as err:  # safetensors raises several types for corrupt files
                raise ValueError(f"policy.checkpoint: cannot read {path}: {err}") from err
        ours = self.config.to_dict()
        differ = {k: (saved[k], ours[k]) for k in ours if k in saved and saved[k] != ours[k]}
        if differ:
            detail = ", ".join(f"{k}={a!r} (config says {b!r})" for k, (a, b) in differ.items())
            raise ValueError(f"policy.checkpoint {path} does not match the policy config: it has {detail}")
        try:
            missing, unexpected = self.load_state_dict(state, strict=False)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(f"policy.checkpoint {path} does not match the policy: {err}") from err
        if missing or unexpected:
            raise ValueError(f"policy.checkpoint {path} does not match the policy: missing {missing[:3]}, unexpected {unexpected[:3]}")
        log.info("loaded policy weights from %s", path)
