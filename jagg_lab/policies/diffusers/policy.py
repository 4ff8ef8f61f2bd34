"""A diffusers flow-matching transformer (SD3 / SD3.5, FLUX) as the policy, in latent space.

The rest of the project sees latents (B, C, h, w) in `sample_shape`, `forward(x, s, cond)`,
`decode(x)` and `encode_prompts`; a per-family adapter (`adapter.py`) hides how SD3 and FLUX
transformers are called. The constructor takes components already built; `from_pretrained`
loads them from a local pipeline directory (what the Hydra configs do) and `sd3_random` builds a
weight-free SD3.5-Medium-shaped model for GPU timing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from jagg_lab.policies.diffusers.adapter import TransformerAdapter, adapter_class
from jagg_lab.policies.diffusers.loading import load_pipeline
from jagg_lab.policies.diffusers.lora import SD3_LORA_TARGETS, make_trainable, register_checkpoint_hooks
from jagg_lab.policies.diffusers.prompt_cache import PromptCache, PromptEncoder
from jagg_lab.policies.diffusers.random_model import (SD3_TEXT_LENGTH, SD35_MEDIUM_SCHEDULER, RandomPromptEncoder,
                                                      sd35_medium_transformer)
from jagg_lab.sampling.schedule import PipelineSchedule
from jagg_lab.types import Cond

__all__ = ["DiffusersPolicy", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"policy.dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


class _Frozen:
    """The frozen pipeline parts (VAE, prompt encoder behind its cache).

    Deliberately NOT an nn.Module attribute of the policy: so they are not in its state_dict
    (checkpoints), not deep-copied (the EMA copy and the frozen KL reference of a full
    fine-tune share them), not seen by the optimizer, and not moved by Lightning; they follow
    the transformer's device lazily (`place`).
    """

    def __init__(self, vae: nn.Module | None, prompt_cache: PromptCache):
        self.vae = vae
        self.prompt_cache = prompt_cache
        self.device: torch.device | None = None

    def __deepcopy__(self, memo: dict) -> "_Frozen":
        return self  # shared by design, see the class docstring

    def place(self, device: torch.device) -> None:
        if device == self.device:
            return
        if self.vae is not None:
            self.vae.to(device)
        if hasattr(self.prompt_cache.encoder, "to"):
            self.prompt_cache.encoder.to(device)
        self.device = device


def _latent_geometry(
    kind: str, adapter: TransformerAdapter, vae: nn.Module | None, resolution: int, vae_scale_factor: int | None
) -> tuple[int, tuple[int, int, int]]:
    """(VAE scale factor, sample shape (C, h, w)) at `resolution` pixels, or an error naming the key."""
    scale = 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else vae_scale_factor or 8
    channels, patch = adapter.channels, adapter.token_patch
    if resolution < 1 or resolution % (scale * patch):
        raise ValueError(
            f"policy.resolution must be a positive multiple of {scale * patch} (VAE scale {scale} x "
            f"patch {patch}), got {resolution}"
        )
    side = resolution // scale
    max_side = adapter.max_token_side
    if max_side is not None and side // patch > max_side:
        raise ValueError(
            f"policy.resolution {resolution} is too large for this {kind.upper()} transformer "
            f"(at most {max_side * patch * scale} px)"
        )
    if vae is not None and vae.config.latent_channels != channels:
        raise ValueError(f"the VAE has {vae.config.latent_channels} latent channels but the {kind} transformer expects {channels}")
    return scale, (channels, side, side)


class DiffusersPolicy(nn.Module):
    """v(x, s, cond) of a diffusers SD3 or FLUX transformer on latents x (B, C, h, w).

    kind: "sd3" (SD3 / SD3.5 MMDiT) or "flux". transformer: its diffusers transformer. vae: its
    VAE, or None (`decode` is then a timing-only placeholder). prompt_encoder: prompts ->
    {"prompt_embeds": (B, T, D), "pooled": (B, P)}. resolution: image side in pixels; the latent
    side is resolution / VAE scale factor. lora_rank, lora_alpha, lora_target_modules: LoRA
    adapters on these module names (peft suffix match); lora_target_modules None = no LoRA, the
    whole transformer is trained. dtype: compute dtype; float32 runs without autocast,
    bfloat16/float16 autocast inside `forward`. A LoRA policy stores its frozen base in this dtype
    and its adapters in float32; a full fine-tune keeps float32 master weights.
    gradient_checkpointing: recompute block activations in backward (far less memory, one extra
    forward per backward). guidance_embed: the guidance value fed to guidance-distilled FLUX
    transformers (FLUX.1-dev: 3.5); required exactly when the transformer has a guidance
    embedding. prompt_cache_size: prompts whose embeddings are kept (LRU, on CPU; 0 = no cache).
    decode_batch_size: images per VAE decode call. checkpoint_frozen: also write the frozen base
    weights into checkpoints (off: a LoRA policy saves only its adapters). vae_scale_factor:
    pixels per latent cell when there is no VAE (default 8). scheduler_config: the pipeline's
    `FlowMatchEulerDiscreteScheduler` config (None: that scheduler's defaults, shift 1): it sets
    `pipeline_schedule`, the grid `sampler.schedule=pipeline` samples on at this resolution.
    """

    sample_shape: tuple[int, int, int]

    def __init__(
        self,
        kind: str,
        transformer: nn.Module,
        vae: nn.Module | None,
        prompt_encoder: PromptEncoder,
        resolution: int,
        lora_rank: int = 32,
        lora_alpha: float = 64.0,
        lora_target_modules: list[str] | tuple[str, ...] | None = None,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        guidance_embed: float | None = None,
        prompt_cache_size: int = 1024,
        decode_batch_size: int = 8,
        checkpoint_frozen: bool = False,
        vae_scale_factor: int | None = None,
        scheduler_config: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        adapter_cls = adapter_class(kind)
        self.kind = kind
        self.compute_dtype = _dtype(dtype)
        prompt_cache = PromptCache(prompt_encoder, prompt_cache_size)
        if decode_batch_size < 1:
            raise ValueError(f"policy.decode_batch_size must be >= 1, got {decode_batch_size}")
        self.decode_batch_size = decode_batch_size
        self.checkpoint_frozen = checkpoint_frozen
        self.adapter = adapter_cls(transformer.config, guidance_embed)
        self.vae_scale_factor, self.sample_shape = _latent_geometry(kind, self.adapter, vae, resolution, vae_scale_factor)
        self.scheduler_config = dict(scheduler_config or {})

        self.has_adapters = lora_target_modules is not None
        self._adapters_off_depth = 0
        self.transformer = transformer
        make_trainable(transformer, lora_rank, lora_alpha, lora_target_modules, self.compute_dtype)
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()

        if vae is not None:
            vae.requires_grad_(False).eval()
            # SD3/FLUX VAE configs ask for float32 decoding (force_upcast): half precision overflows.
            nn.Module.to(vae, torch.float32 if getattr(vae.config, "force_upcast", True) else self.compute_dtype)
        self._frozen = _Frozen(vae, prompt_cache)
        register_checkpoint_hooks(self)

    # ---- building one from disk, or without weights ------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        kind: str = "sd3",
        pretrained: str | None = None,
        resolution: int = 512,
        lora_rank: int = 32,
        lora_alpha: float = 64.0,
        lora_target_modules: list[str] | None = None,
        dtype: str = "bfloat16",
        gradient_checkpointing: bool = False,
        guidance_embed: float | None = None,
        max_sequence_length: int | None = None,
        local_files_only: bool = True,
        prompt_cache_size: int = 1024,
        decode_batch_size: int = 8,
        checkpoint_frozen: bool = False,
    ) -> "DiffusersPolicy":
        """The policy of a local diffusers pipeline: the Hydra target of `policy=sd3` and `policy=flux`.

        pretrained: a diffusers pipeline directory (or a hub id already in the local cache)
        holding transformer, VAE, text encoders and tokenizers. max_sequence_length: T5 tokens
        (None: the pipeline's default, 256 for SD3, 512 for FLUX). local_files_only: never
        contact the hub. Other arguments as in the constructor.
        """
        adapter = adapter_class(kind)
        transformer, vae, encoder, scheduler_config = load_pipeline(
            kind, adapter, pretrained, _dtype(dtype), full_finetune=lora_target_modules is None,
            max_sequence_length=max_sequence_length, local_files_only=local_files_only,
        )
        return cls(
            kind, transformer, vae, encoder, resolution=resolution, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_target_modules=lora_target_modules, dtype=dtype, gradient_checkpointing=gradient_checkpointing,
            guidance_embed=guidance_embed, prompt_cache_size=prompt_cache_size,
            decode_batch_size=decode_batch_size, checkpoint_frozen=checkpoint_frozen, scheduler_config=scheduler_config,
        )

    @classmethod
    def sd3_random(
        cls,
        resolution: int = 512,
        dtype: str = "bfloat16",
        lora_rank: int = 32,
        lora_alpha: float = 64.0,
        lora_target_modules: list[str] | tuple[str, ...] | None = SD3_LORA_TARGETS,
        gradient_checkpointing: bool = False,
        num_layers: int = 24,
        text_length: int = SD3_TEXT_LENGTH,
        pos_embed_max_size: int = 384,
        seed: int = 0,
        device: str | None = None,
    ) -> "DiffusersPolicy":
        """SD3.5-Medium's transformer with random weights, no VAE, random prompt embeddings:
        the real model's compute at `resolution` with no weights to download. FOR TIMING ONLY:
        `decode` returns sigmoid of the first 3 latent channels (B, 3, h, w), not an image.
        The Hydra target of `policy=sd3_random`.

        num_layers: fewer blocks (the first min(13, num_layers) keep dual attention), e.g. 1 for
        a CPU smoke test. text_length: prompt tokens (SD3: 77 CLIP + 256 T5 = 333).
        pos_embed_max_size: side of the positional table (384 in SD3.5; its buffer alone is
        0.9 GB in float32, so CPU tests may shrink it; it must be >= latent side / 2).
        device: where to build it (None = CPU; "cuda" initialises the 2.5B weights on the GPU,
        far faster than on CPU). With LoRA the weights are created directly in `dtype`, the
        dtype the frozen base is kept in anyway (half the host memory of float32).
        """
        init_dtype = _dtype(dtype) if lora_target_modules is not None else torch.float32
        transformer = sd35_medium_transformer(num_layers, pos_embed_max_size, seed, init_dtype, device)
        config = transformer.config
        encoder = RandomPromptEncoder(text_length, config.joint_attention_dim, config.pooled_projection_dim)
        return cls(
            "sd3", transformer, None, encoder, resolution=resolution, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_target_modules=lora_target_modules, dtype=dtype, gradient_checkpointing=gradient_checkpointing,
            vae_scale_factor=8, scheduler_config=SD35_MEDIUM_SCHEDULER,
        )

    # ---- the policy protocol -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the transformer computes: its weights' device, or for weights sharded over a GPU
        mesh (`trainer=fsdp`, perhaps offloaded to host memory) this process's GPU."""
        weight = next(self.transformer.parameters())
        mesh = getattr(weight, "device_mesh", None)
        if mesh is None or mesh.device_type == "cpu":
            return weight.device
        return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())

    @property
    def pipeline_schedule(self) -> PipelineSchedule:
        """The pipeline's sigma grid at this resolution (`sampler.schedule=pipeline`); ValueError if its
        scheduler uses an option that is not reproduced (see PipelineSchedule.from_scheduler_config)."""
        _, h, w = self.sample_shape
        tokens = (h // self.adapter.token_patch) * (w // self.adapter.token_patch)  # the pipeline's image_seq_len
        return PipelineSchedule.from_scheduler_config(self.scheduler_config, self.adapter.sigma_spacing, tokens)

    @property
    def vae(self) -> nn.Module | None:
        return self._frozen.vae

    def encode_prompts(self, prompts: list[str]) -> Cond:
        """Prompt conditioning, one row per prompt: {"prompt_embeds": (B, T, D), "pooled": (B, P)}.
        Each distinct prompt is encoded once and kept in an LRU cache (`PromptCache`)."""
        device = self.device
        self._frozen.place(device)
        return self._frozen.prompt_cache(prompts, device)

    def forward(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """Velocity v (B, C, h, w) at latents x (B, C, h, w), noise levels s (B,) in [0, 1]."""
        autocast = self.compute_dtype != torch.float32
        embeds, pooled = cond["prompt_embeds"], cond["pooled"]  # (B, T, D), (B, P)
        if not autocast:  # without autocast, inputs must match the float32 weights
            embeds, pooled = embeds.float(), pooled.float()
        with torch.autocast(x.device.type, dtype=self.compute_dtype, enabled=autocast):
            out = self.adapter.velocity(self.transformer, x, s, embeds, pooled)
        return out.to(x.dtype)

    def shard_modules(self) -> list[nn.Module]:
        """What FSDP shards, one unit each, inner ones first (`jagg_lab.sharding`): every transformer
        block (FLUX: the double- and the single-stream ones), then the rest of the transformer."""
        blocks = [*getattr(self.transformer, "transformer_blocks", ()), *getattr(self.transformer, "single_transformer_blocks", ())]
        return [*blocks, self.transformer]

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents (B, C, h, w) -> images (B, 3, H, W) float32 in [0, 1] (VAE decode after undoing
        the pipeline's latent scaling and shift). Without a VAE (`sd3_random`): a timing-only
        placeholder, sigmoid of the first 3 latent channels, (B, 3, h, w)."""
        vae = self._frozen.vae
        if vae is None:
            return torch.sigmoid(x[:, :3].float())
        self._frozen.place(self.device)
        shift = getattr(vae.config, "shift_factor", None) or 0.0
        latents = x / vae.config.scaling_factor + shift
        dtype = next(vae.parameters()).dtype
        images = [vae.decode(chunk.to(dtype), return_dict=False)[0] for chunk in latents.split(self.decode_batch_size)]
        return ((torch.cat(images).float() + 1) / 2).clamp(0, 1)

    # ---- LoRA --------------------------------------------------------------------------------
    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the base model: the LoRA adapters are bypassed inside the block (nestable).
        The training module uses this as the KL reference of a LoRA policy."""
        if not self.has_adapters:
            raise RuntimeError("adapters_disabled(): this policy has no LoRA adapters (policy.lora_target_modules is null)")
        if self._adapters_off_depth == 0:
            self.transformer.disable_adapters()
        self._adapters_off_depth += 1
        try:
            yield
        finally:
            self._adapters_off_depth -= 1
            if self._adapters_off_depth == 0:
                self.transformer.enable_adapters()

    def extra_repr(self) -> str:
        return f"kind={self.kind}, sample_shape={self.sample_shape}, dtype={self.compute_dtype}, lora={self.has_adapters}"
