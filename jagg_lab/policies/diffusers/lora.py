"""What a diffusers policy trains (LoRA adapters or the whole transformer), and checkpoint hooks
so that a LoRA policy saves only what it trains."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["SD3_LORA_TARGETS", "FLUX_LORA_TARGETS", "make_trainable", "register_checkpoint_hooks"]

# Flow-GRPO's LoRA targets for SD3.5: the joint attention's image and text projections.
# ("attn.to_q" does not match the SD3.5 dual-attention "attn2.to_q": peft matches name suffixes.)
SD3_LORA_TARGETS = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
)
# FLUX: the same names cover the double-stream blocks (both streams) and, for to_q/k/v,
# the single-stream blocks.
FLUX_LORA_TARGETS = SD3_LORA_TARGETS


def make_trainable(
    transformer: nn.Module,
    lora_rank: int,
    lora_alpha: float,
    lora_target_modules: list[str] | tuple[str, ...] | None,
    base_dtype: torch.dtype,
) -> None:
    """LoRA adapters on `lora_target_modules` (peft suffix match) over a frozen base, or, for
    None, the whole transformer trained in float32 (master weights)."""
    if lora_target_modules is None:
        transformer.requires_grad_(True).float()
        return
    from peft import LoraConfig

    if lora_rank < 1:
        raise ValueError(f"policy.lora_rank must be >= 1, got {lora_rank}")
    targets = list(lora_target_modules)
    if not targets:
        raise ValueError("policy.lora_target_modules is empty; give module names, or null for a full fine-tune")
    # The frozen base in the compute dtype (half the memory in bf16); adapters in float32,
    # the precision their optimizer needs. autocast mixes them in forward.
    nn.Module.to(transformer.requires_grad_(False), base_dtype)  # plain cast (ModelMixin.to only adds a warning)
    try:
        transformer.add_adapter(
            LoraConfig(r=lora_rank, lora_alpha=lora_alpha, init_lora_weights="gaussian", target_modules=targets)
        )
    except ValueError as err:
        raise ValueError(f"policy.lora_target_modules {targets}: {err}") from err
    for p in transformer.parameters():
        if p.requires_grad:
            p.data = p.data.float()


# ---- checkpoint hooks: the policy has `transformer`, `has_adapters` and `checkpoint_frozen` ----
def _frozen_state_keys(policy: nn.Module, prefix: str) -> list[str]:
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


def register_checkpoint_hooks(policy: nn.Module) -> None:
    """Make `policy.state_dict()` leave out, and `load_state_dict` accept the absence of, the
    frozen base of a LoRA policy (unless `policy.checkpoint_frozen`)."""
    policy.register_state_dict_post_hook(_drop_frozen_state)
    policy.register_load_state_dict_pre_hook(_fill_frozen_state)
