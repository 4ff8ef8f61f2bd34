"""A diffusers flow-matching transformer (SD3 / SD3.5, FLUX) as the policy, in latent space.

The project's convention is the SD3 one: x_s = (1 - s) x0 + s eps with s = 1 noise and
s = 0 data, and the network predicts v ~ eps - x0. SD3 and FLUX transformers predict exactly
this velocity; they differ only in how they are called:

  * SD3 takes latents (B, C, h, w) and `timestep = s * 1000` (the pipeline passes the
    scheduler's timesteps, which are sigmas * 1000).
  * FLUX takes 2x2-packed latents (B, h/2 * w/2, 4C), `timestep = s` (the pipeline passes
    t / 1000; the model multiplies by 1000 itself), position ids for image and text tokens,
    and, for guidance-distilled checkpoints (FLUX.1-dev), a guidance value.

`DiffusersPolicy` hides these differences: the rest of the project sees latents
(B, C, h, w) in `sample_shape`, `forward(x, s, cond)`, `decode(x)` and `encode_prompts`.

Build one from a local diffusers pipeline directory (`DiffusersPolicy(kind=..., pretrained=...)`,
what the Hydra configs do), from components you already have (`from_components`, used by the
tests), or as a weight-free SD3.5-Medium-shaped model for GPU timing (`sd3_random`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from jagg_lab.types import Cond

__all__ = [
    "DiffusersPolicy",
    "PromptEncoder",
    "KINDS",
    "DTYPES",
    "SD3_LORA_TARGETS",
    "FLUX_LORA_TARGETS",
    "SD35_MEDIUM_TRANSFORMER",
    "pack_latents",
    "unpack_latents",
    "flux_image_ids",
]

log = logging.getLogger(__name__)

KINDS = ("sd3", "flux")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# prompts -> {"prompt_embeds": (B, T, D), "pooled": (B, P)}, batch-first, one row per prompt
PromptEncoder = Callable[[list[str]], Cond]

# Flow-GRPO's LoRA targets for SD3.5: the joint attention's image and text projections.
# ("attn.to_q" does not match the SD3.5 dual-attention "attn2.to_q": peft matches name suffixes.)
SD3_LORA_TARGETS = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
)
# FLUX: the same names cover the double-stream blocks (both streams) and, for to_q/k/v,
# the single-stream blocks.
FLUX_LORA_TARGETS = SD3_LORA_TARGETS

# `transformer/config.json` of stabilityai/stable-diffusion-3.5-medium (2.5B parameters):
# 24 MMDiT-X blocks of width 24 x 64 = 1536, the first 13 with a second (image-only) attention.
SD35_MEDIUM_TRANSFORMER: dict[str, Any] = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 384,
    "dual_attention_layers": tuple(range(13)),
    "qk_norm": "rms_norm",
}
# SD3's prompt sequence: 77 CLIP tokens followed by 256 T5 tokens (pipeline default).
SD3_TEXT_LENGTH = 77 + 256


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"policy.dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


# ---- FLUX latent packing ------------------------------------------------------------------
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


# ---- frozen parts --------------------------------------------------------------------------
class _PipelinePromptEncoder:
    """Prompt embeddings from a diffusers pipeline's own `encode_prompt` (its text encoders
    and tokenizers), as batch-first {"prompt_embeds": (B, T, D), "pooled": (B, P)}."""

    def __init__(self, pipe: Any, kind: str, max_sequence_length: int | None):
        self.pipe = pipe
        self.kind = kind
        self.max_sequence_length = max_sequence_length or (256 if kind == "sd3" else 512)

    def encoders(self) -> list[nn.Module]:
        names = ("text_encoder", "text_encoder_2", "text_encoder_3")
        return [m for m in (getattr(self.pipe, n, None) for n in names) if m is not None]

    def to(self, device: torch.device) -> "_PipelinePromptEncoder":
        for encoder in self.encoders():
            encoder.to(device)
        return self

    def __call__(self, prompts: list[str]) -> Cond:
        encoders = self.encoders()
        device = next(encoders[0].parameters()).device if encoders else torch.device("cpu")
        if self.kind == "sd3":
            embeds, _, pooled, _ = self.pipe.encode_prompt(
                prompt=prompts, prompt_2=None, prompt_3=None, device=device, num_images_per_prompt=1,
                do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length,
            )
        else:
            embeds, pooled, _ = self.pipe.encode_prompt(
                prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=1,
                max_sequence_length=self.max_sequence_length,
            )
        return {"prompt_embeds": embeds, "pooled": pooled}


class _RandomPromptEncoder:
    """Fixed random embeddings of SD3's shapes, for timing without text encoders: each prompt's
    embedding is seeded by its text (stable across processes), so equal prompts agree."""

    def __init__(self, text_length: int, embed_dim: int, pooled_dim: int):
        self.text_length, self.embed_dim, self.pooled_dim = text_length, embed_dim, pooled_dim

    def __call__(self, prompts: list[str]) -> Cond:
        embeds, pooled = [], []
        for prompt in prompts:
            seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:7], "little")
            generator = torch.Generator().manual_seed(seed)
            embeds.append(torch.randn(self.text_length, self.embed_dim, generator=generator))
            pooled.append(torch.randn(self.pooled_dim, generator=generator))
        return {"prompt_embeds": torch.stack(embeds), "pooled": torch.stack(pooled)}


class _Frozen:
    """The frozen pipeline parts (VAE, prompt encoder) and the prompt-embedding cache.

    Deliberately NOT an nn.Module attribute of the policy: so they are not in its state_dict
    (checkpoints), not deep-copied (the EMA copy and the frozen KL reference of a full
    fine-tune share them), not seen by the optimizer, and not moved by Lightning; they follow
    the transformer's device lazily (`place`).
    """

    def __init__(self, vae: nn.Module | None, prompt_encoder: PromptEncoder, cache_size: int):
        self.vae = vae
        self.prompt_encoder = prompt_encoder
        self.cache_size = cache_size
        self.cache: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()  # LRU, CPU tensors
        self.device: torch.device | None = None

    def __deepcopy__(self, memo: dict) -> "_Frozen":
        return self  # shared by design, see the class docstring

    def place(self, device: torch.device) -> None:
        if device == self.device:
            return
        if self.vae is not None:
            self.vae.to(device)
        if hasattr(self.prompt_encoder, "to"):
            self.prompt_encoder.to(device)
        self.device = device


# ---- checkpoint hooks: a LoRA policy saves only what it trains ------------------------------
def _frozen_state_keys(policy: "DiffusersPolicy", prefix: str) -> list[str]:
    keys = [f"{prefix}transformer.{n}" for n, p in policy.transformer.named_parameters() if not p.requires_grad]
    keys += [f"{prefix}transformer.{n}" for n, _ in policy.transformer.named_buffers()]
    return keys


def _drop_frozen_state(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict post-hook: without `checkpoint_frozen`, a LoRA policy's checkpoint holds only its
    trainable (LoRA) weights; the frozen base (GBs for SD3.5 / FLUX) is reloaded from `pretrained`."""
    if module.has_adapters and not module.checkpoint_frozen:
        for key in _frozen_state_keys(module, prefix):
            state_dict.pop(key, None)


def _fill_frozen_state(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: frozen entries a checkpoint left out keep their current values,
    so strict loading (Lightning's resume) accepts a LoRA-only checkpoint."""
    if not module.has_adapters:
        return
    current = {f"{prefix}transformer.{n}": t for n, t in module.transformer.state_dict(keep_vars=True).items()}
    for key in _frozen_state_keys(module, prefix):
        if key not in state_dict and key in current:
            state_dict[key] = current[key].detach()



# ---- the policy ----------------------------------------------------------------------------
class DiffusersPolicy(nn.Module):
    """v(x, s, cond) of a diffusers SD3 or FLUX transformer on latents x (B, C, h, w).

    kind: "sd3" (SD3 / SD3.5 MMDiT) or "flux". pretrained: a diffusers pipeline directory (or a
    hub id already in the local cache) holding transformer, VAE, text encoders and tokenizers.
    resolution: image side in pixels; the latent side is resolution / VAE scale factor.
    lora_rank, lora_alpha, lora_target_modules: LoRA adapters on these module names (peft
    suffix match); lora_target_modules null = no LoRA, the whole transformer is trained.
    dtype: compute dtype; float32 runs without autocast, bfloat16/float16 autocast inside
    `forward`. A LoRA policy stores its frozen base in this dtype and its adapters in float32;
    a full fine-tune keeps float32 master weights. gradient_checkpointing: recompute block
    activations in backward (far less memory, one extra forward per backward). guidance_embed: the guidance
    value fed to guidance-distilled FLUX transformers (FLUX.1-dev: 3.5); required exactly when
    the transformer has a guidance embedding. max_sequence_length: T5 tokens (null: the
    pipeline's default, 256 for SD3, 512 for FLUX). local_files_only: never contact the hub.
    prompt_cache_size: prompts whose embeddings are kept (LRU, on CPU; 0 = no cache).
    decode_batch_size: images per VAE decode call. checkpoint_frozen: also write the frozen
    base weights into checkpoints (off: a LoRA policy saves only its adapters).
    """

    sample_shape: tuple[int, int, int]

    def __init__(
        self,
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
    ):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"policy.kind must be one of {list(KINDS)}, got {kind!r}")
        compute = _dtype(dtype)
        transformer, vae, encoder = _load_pipeline(
            kind, pretrained, compute, full_finetune=lora_target_modules is None,
            max_sequence_length=max_sequence_length, local_files_only=local_files_only,
        )
        self._setup(
            kind, transformer, vae, encoder, resolution=resolution, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_target_modules=lora_target_modules, dtype=dtype, gradient_checkpointing=gradient_checkpointing,
            guidance_embed=guidance_embed, prompt_cache_size=prompt_cache_size,
            decode_batch_size=decode_batch_size, checkpoint_frozen=checkpoint_frozen,
        )

    # ---- alternative constructors -------------------------------------------------------
    @classmethod
    def from_components(
        cls,
        kind: str,
        transformer: nn.Module,
        vae: nn.Module | None,
        prompt_encoder: PromptEncoder,
        *,
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
    ) -> "DiffusersPolicy":
        """A policy from a transformer, a VAE (or None: `decode` is then a timing-only
        placeholder) and a prompt encoder (prompts -> {"prompt_embeds": (B, T, D),
        "pooled": (B, P)}). For tests, benchmarks and your own loading code. Other arguments as
        in the constructor, except that dtype defaults to float32 here.
        vae_scale_factor: pixels per latent cell when there is no VAE (default 8)."""
        if kind not in KINDS:
            raise ValueError(f"policy.kind must be one of {list(KINDS)}, got {kind!r}")
        policy = cls.__new__(cls)
        nn.Module.__init__(policy)
        policy._setup(
            kind, transformer, vae, prompt_encoder, resolution=resolution, lora_rank=lora_rank,
            lora_alpha=lora_alpha, lora_target_modules=lora_target_modules, dtype=dtype,
            gradient_checkpointing=gradient_checkpointing, guidance_embed=guidance_embed,
            prompt_cache_size=prompt_cache_size, decode_batch_size=decode_batch_size,
            checkpoint_frozen=checkpoint_frozen, vae_scale_factor=vae_scale_factor,
        )
        return policy

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

        num_layers: fewer blocks (the first min(13, num_layers) keep dual attention), e.g. 1 for
        a CPU smoke test. text_length: prompt tokens (SD3: 77 CLIP + 256 T5 = 333).
        pos_embed_max_size: side of the positional table (384 in SD3.5; its buffer alone is
        0.9 GB in float32, so CPU tests may shrink it; it must be >= latent side / 2).
        device: where to build it (null = CPU; "cuda" initialises the 2.5B weights on the GPU,
        far faster than on CPU). With LoRA the weights are created directly in `dtype`, the
        dtype the frozen base is kept in anyway (half the host memory of float32).
        """
        from diffusers import SD3Transformer2DModel

        config = dict(SD35_MEDIUM_TRANSFORMER)
        config.update(
            num_layers=num_layers,
            dual_attention_layers=tuple(i for i in config["dual_attention_layers"] if i < num_layers),
            pos_embed_max_size=pos_embed_max_size,
        )
        torch.manual_seed(seed)
        init_dtype = _dtype(dtype) if lora_target_modules is not None else torch.float32
        previous = torch.get_default_dtype()
        torch.set_default_dtype(init_dtype)
        try:
            with torch.device(device or "cpu"):
                transformer = SD3Transformer2DModel(**config)
        finally:
            torch.set_default_dtype(previous)
        encoder = _RandomPromptEncoder(text_length, config["joint_attention_dim"], config["pooled_projection_dim"])
        return cls.from_components(
            "sd3", transformer, None, encoder, resolution=resolution, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_target_modules=lora_target_modules, dtype=dtype, gradient_checkpointing=gradient_checkpointing,
            vae_scale_factor=8,
        )

    # ---- setup shared by every constructor ----------------------------------------------------
    def _setup(
        self,
        kind: str,
        transformer: nn.Module,
        vae: nn.Module | None,
        prompt_encoder: PromptEncoder,
        *,
        resolution: int,
        lora_rank: int,
        lora_alpha: float,
        lora_target_modules: list[str] | tuple[str, ...] | None,
        dtype: str,
        gradient_checkpointing: bool,
        guidance_embed: float | None,
        prompt_cache_size: int,
        decode_batch_size: int,
        checkpoint_frozen: bool,
        vae_scale_factor: int | None = None,
    ) -> None:
        self.kind = kind
        self.compute_dtype = _dtype(dtype)
        if prompt_cache_size < 0:
            raise ValueError(f"policy.prompt_cache_size must be >= 0, got {prompt_cache_size}")
        if decode_batch_size < 1:
            raise ValueError(f"policy.decode_batch_size must be >= 1, got {decode_batch_size}")
        self.decode_batch_size = decode_batch_size
        self.checkpoint_frozen = checkpoint_frozen
        config = transformer.config

        # guidance embedding: FLUX-dev is guidance-distilled and needs the value; others must not get one
        has_guidance = bool(getattr(config, "guidance_embeds", False))
        if has_guidance and guidance_embed is None:
            raise ValueError("policy.guidance_embed must be set: this FLUX transformer has a guidance embedding (FLUX.1-dev uses 3.5)")
        if guidance_embed is not None and not has_guidance:
            raise ValueError(f"policy.guidance_embed={guidance_embed} but this transformer has no guidance embedding; set it to null")
        self.guidance_embed = guidance_embed

        # latent geometry
        if vae is not None:
            scale = 2 ** (len(vae.config.block_out_channels) - 1)
        else:
            scale = vae_scale_factor or 8
        channels = config.in_channels if kind == "sd3" else config.in_channels // 4
        token_patch = config.patch_size if kind == "sd3" else 2  # FLUX tokens are 2x2 latent patches
        if resolution < 1 or resolution % (scale * token_patch):
            raise ValueError(
                f"policy.resolution must be a positive multiple of {scale * token_patch} (VAE scale {scale} x "
                f"patch {token_patch}), got {resolution}"
            )
        side = resolution // scale
        max_pos = getattr(config, "pos_embed_max_size", None)
        if kind == "sd3" and max_pos is not None and side // token_patch > max_pos:
            raise ValueError(f"policy.resolution {resolution} is too large for this SD3 transformer (at most {max_pos * token_patch * scale} px)")
        if vae is not None and vae.config.latent_channels != channels:
            raise ValueError(f"the VAE has {vae.config.latent_channels} latent channels but the {kind} transformer expects {channels}")
        self.vae_scale_factor = scale
        self.sample_shape = (channels, side, side)

        # LoRA or full fine-tune
        self.has_adapters = lora_target_modules is not None
        self._adapters_off_depth = 0
        self.transformer = transformer
        if self.has_adapters:
            from peft import LoraConfig

            if lora_rank < 1:
                raise ValueError(f"policy.lora_rank must be >= 1, got {lora_rank}")
            targets = list(lora_target_modules)
            if not targets:
                raise ValueError("policy.lora_target_modules is empty; give module names, or null for a full fine-tune")
            # The frozen base in the compute dtype (half the memory in bf16); adapters in float32,
            # the precision their optimizer needs. autocast mixes them in forward.
            nn.Module.to(transformer.requires_grad_(False), self.compute_dtype)  # plain cast (ModelMixin.to only adds a warning)
            try:
                transformer.add_adapter(
                    LoraConfig(r=lora_rank, lora_alpha=lora_alpha, init_lora_weights="gaussian", target_modules=targets)
                )
            except ValueError as err:
                raise ValueError(f"policy.lora_target_modules {targets}: {err}") from err
            for p in transformer.parameters():
                if p.requires_grad:
                    p.data = p.data.float()
        else:
            transformer.requires_grad_(True).float()
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()

        if vae is not None:
            vae.requires_grad_(False).eval()
            # SD3/FLUX VAE configs ask for float32 decoding (force_upcast): half precision overflows.
            nn.Module.to(vae, torch.float32 if getattr(vae.config, "force_upcast", True) else self.compute_dtype)
        self._frozen = _Frozen(vae, prompt_encoder, prompt_cache_size)
        self._flux_ids: dict[tuple, torch.Tensor] = {}
        self.register_state_dict_post_hook(_drop_frozen_state)
        self.register_load_state_dict_pre_hook(_fill_frozen_state)

    # ---- the policy protocol -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def vae(self) -> nn.Module | None:
        return self._frozen.vae

    def encode_prompts(self, prompts: list[str]) -> Cond:
        """Prompt conditioning, one row per prompt: {"prompt_embeds": (B, T, D), "pooled": (B, P)}.

        Each distinct prompt is encoded once (one batched encoder call for the new ones) and kept
        in an LRU cache: a GRPO batch repeats every prompt group_size times and encodes the null
        prompt "" (the CFG negative) every rollout.
        """
        device = self.device
        self._frozen.place(device)
        cache = self._frozen.cache
        found: dict[str, dict[str, torch.Tensor]] = {}
        for prompt in prompts:
            if prompt in cache:
                cache.move_to_end(prompt)
                found[prompt] = cache[prompt]
        new = list(dict.fromkeys(p for p in prompts if p not in found))
        if new:
            # Normal (not inference-mode) tensors even when called under inference_mode, so a
            # cached embedding can later feed a forward that records a graph.
            with torch.inference_mode(False), torch.no_grad():
                encoded = self._frozen.prompt_encoder(new)
            for key in ("prompt_embeds", "pooled"):
                if key not in encoded or encoded[key].shape[0] != len(new):
                    raise ValueError(f"the prompt encoder must return {key!r} with {len(new)} rows, got {sorted(encoded)}")
            for i, prompt in enumerate(new):
                row = {k: v[i].detach().to("cpu") for k, v in encoded.items()}
                found[prompt] = row
                if self._frozen.cache_size:
                    cache[prompt] = row
            while len(cache) > self._frozen.cache_size:
                cache.popitem(last=False)
        keys = found[prompts[0]].keys()
        return {k: torch.stack([found[p][k] for p in prompts]).to(device) for k in keys}

    def forward(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """Velocity v (B, C, h, w) at latents x (B, C, h, w), noise levels s (B,) in [0, 1]."""
        autocast = self.compute_dtype != torch.float32
        embeds, pooled = cond["prompt_embeds"], cond["pooled"]
        if not autocast:  # without autocast, inputs must match the float32 weights
            embeds, pooled = embeds.float(), pooled.float()
        with torch.autocast(x.device.type, dtype=self.compute_dtype, enabled=autocast):
            if self.kind == "sd3":
                out = self.transformer(
                    hidden_states=x, encoder_hidden_states=embeds, pooled_projections=pooled,
                    timestep=s * 1000, return_dict=False,
                )[0]
            else:
                h, w = x.shape[-2:]
                guidance = None
                if self.guidance_embed is not None:
                    guidance = torch.full((x.shape[0],), float(self.guidance_embed), device=x.device)
                out = self.transformer(
                    hidden_states=pack_latents(x), encoder_hidden_states=embeds, pooled_projections=pooled,
                    timestep=s, guidance=guidance, img_ids=self._image_ids(h, w, x.device),
                    txt_ids=torch.zeros(embeds.shape[1], 3, device=x.device), return_dict=False,
                )[0]
                out = unpack_latents(out, h, w)
        return out.to(x.dtype)

    def _image_ids(self, h: int, w: int, device: torch.device) -> torch.Tensor:
        key = (h, w, str(device))
        if key not in self._flux_ids:
            self._flux_ids[key] = flux_image_ids(h, w, device)
        return self._flux_ids[key]

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


# ---- loading a pipeline ------------------------------------------------------------------------
def _load_pipeline(
    kind: str,
    pretrained: str | None,
    compute: torch.dtype,
    *,
    full_finetune: bool,
    max_sequence_length: int | None,
    local_files_only: bool,
) -> tuple[nn.Module, nn.Module, _PipelinePromptEncoder]:
    """Transformer, VAE and prompt encoder of a local diffusers pipeline, or a clear error naming
    `policy.pretrained` (raised while the run is being built, before any sampling)."""
    if not pretrained:
        raise ValueError(
            f"policy.pretrained is required for kind={kind!r}: a local diffusers pipeline directory "
            "(e.g. a snapshot of stabilityai/stable-diffusion-3.5-medium); for weight-free timing use "
            "policy=sd3_random"
        )
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    pipeline_cls = StableDiffusion3Pipeline if kind == "sd3" else FluxPipeline
    path = Path(pretrained).expanduser()
    looks_like_path = pretrained.startswith((".", "/", "~")) or path.exists() or pretrained.count("/") != 1
    if looks_like_path and not path.is_dir():
        raise FileNotFoundError(f"policy.pretrained: no such pipeline directory {path}")
    if path.is_dir() and not (path / "model_index.json").is_file():
        raise FileNotFoundError(f"policy.pretrained: {path} is not a diffusers pipeline (no model_index.json)")
    source = str(path) if path.is_dir() else pretrained
    # Components saved as [null, null] (e.g. SD3 without its T5 encoder) must be passed as None.
    absent = {}
    if path.is_dir():
        index = json.loads((path / "model_index.json").read_text())
        absent = {k: None for k, v in index.items() if isinstance(v, list) and v and v[0] is None}
    try:
        with warnings.catch_warnings():
            # diffusers >= 0.36 renames torch_dtype to dtype; the old name works in every version
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            # Everything loads in the compute dtype; a full fine-tune upcasts its transformer below.
            pipe = pipeline_cls.from_pretrained(source, torch_dtype=compute, local_files_only=local_files_only, **absent)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise FileNotFoundError(
            f"policy.pretrained: cannot load a diffusers {pipeline_cls.__name__} from {pretrained!r} "
            f"({type(err).__name__}: {err})"
        ) from err
    transformer, vae = pipe.transformer, pipe.vae
    if full_finetune:
        transformer.float()
    log.info("loaded %s pipeline from %s", kind, source)
    return transformer, vae, _PipelinePromptEncoder(pipe, kind, max_sequence_length)
