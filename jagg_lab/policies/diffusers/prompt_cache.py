"""Prompt embeddings, each distinct prompt encoded once.

A GRPO batch repeats every prompt group_size times and encodes the null prompt "" (the CFG
negative) every rollout, while the text encoders (T5-XXL for SD3 / FLUX) are large.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch

from jagg_lab.types import Cond

__all__ = ["PromptEncoder", "PromptCache"]

# prompts -> {"prompt_embeds": (B, T, D), "pooled": (B, P)}, batch-first, one row per prompt
PromptEncoder = Callable[[list[str]], Cond]


class PromptCache:
    """An LRU of per-prompt embeddings on CPU in front of a prompt encoder.

    encoder: prompts -> {"prompt_embeds": (B, T, D), "pooled": (B, P)}. size: prompts whose
    embeddings are kept (0 = no cache; a call still encodes each distinct prompt once).
    """

    def __init__(self, encoder: PromptEncoder, size: int):
        if size < 0:
            raise ValueError(f"policy.prompt_cache_size must be >= 0, got {size}")
        self.encoder = encoder
        self.size = size
        self.rows: OrderedDict[str, dict[str, torch.Tensor]] = OrderedDict()  # prompt -> CPU row, LRU order

    def __call__(self, prompts: list[str], device: torch.device) -> Cond:
        """Conditioning for `prompts`, one row per prompt, on `device`; one batched encoder call
        for the prompts not cached."""
        found: dict[str, dict[str, torch.Tensor]] = {}
        for prompt in prompts:
            if prompt in self.rows:
                self.rows.move_to_end(prompt)
                found[prompt] = self.rows[prompt]
        new = list(dict.fromkeys(p for p in prompts if p not in found))
        if new:
            # Normal (not inference-mode) tensors even when called under inference_mode, so a
            # cached embedding can later feed a forward that records a graph.
            with torch.inference_mode(False), torch.no_grad():
                encoded = self.encoder(new)
            for key in ("prompt_embeds", "pooled"):
                if key not in encoded or encoded[key].shape[0] != len(new):
                    raise ValueError(f"the prompt encoder must return {key!r} with {len(new)} rows, got {sorted(encoded)}")
            for i, prompt in enumerate(new):
                row = {k: v[i].detach().to("cpu") for k, v in encoded.items()}
                found[prompt] = row
                if self.size:
                    self.rows[prompt] = row
            while len(self.rows) > self.size:
                self.rows.popitem(last=False)
        keys = found[prompts[0]].keys()
        return {k: torch.stack([found[p][k] for p in prompts]).to(device) for k in keys}
