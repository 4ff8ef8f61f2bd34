"""The transformer, VAE and prompt encoder of a local diffusers pipeline directory."""
from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from jagg_lab.checkpointing import refuse_pickled_weights
from jagg_lab.policies.diffusers.adapter import TransformerAdapter
from jagg_lab.types import Cond

__all__ = ["PipelinePromptEncoder", "load_pipeline"]

log = logging.getLogger(__name__)


class PipelinePromptEncoder:
    """Prompt embeddings from a diffusers pipeline's own `encode_prompt` (its text encoders
    and tokenizers), as batch-first {"prompt_embeds": (B, T, D), "pooled": (B, P)}.

    max_sequence_length: T5 tokens (None: the pipeline's default, 256 for SD3, 512 for FLUX).
    """

    def __init__(self, pipe: Any, adapter: type[TransformerAdapter], max_sequence_length: int | None):
        self.pipe = pipe
        self.adapter = adapter
        self.max_sequence_length = max_sequence_length or adapter.default_max_sequence_length

    def encoders(self) -> list[nn.Module]:
        names = ("text_encoder", "text_encoder_2", "text_encoder_3")
        return [m for m in (getattr(self.pipe, n, None) for n in names) if m is not None]

    def to(self, device: torch.device) -> "PipelinePromptEncoder":
        for encoder in self.encoders():
            encoder.to(device)
        return self

    def __call__(self, prompts: list[str]) -> Cond:
        encoders = self.encoders()
        device = next(encoders[0].parameters()).device if encoders else torch.device("cpu")
        embeds, pooled = self.adapter.encode_prompt(self.pipe, prompts, device, self.max_sequence_length)
        return {"prompt_embeds": embeds, "pooled": pooled}


def load_pipeline(
    kind: str,
    adapter: type[TransformerAdapter],
    pretrained: str | None,
    dtype: torch.dtype,
    *,
    full_finetune: bool,
    max_sequence_length: int | None,
    local_files_only: bool,
) -> tuple[nn.Module, nn.Module, PipelinePromptEncoder, dict[str, Any]]:
    """Transformer, VAE, prompt encoder and scheduler config of a local diffusers pipeline, or a
    clear error naming `policy.pretrained` (raised while the run is being built, before any sampling)."""
    if not pretrained:
        raise ValueError(
            f"policy.pretrained is required for kind={kind!r}: a local diffusers pipeline directory "
            "(e.g. a snapshot of stabilityai/stable-diffusion-3.5-medium); for weight-free timing use "
            "policy=sd3_random"
        )
    pipeline_cls = adapter.pipeline_class()
    path = Path(pretrained).expanduser()
    looks_like_path = pretrained.startswith((".", "/", "~")) or path.exists() or pretrained.count("/") != 1
    if looks_like_path and not path.is_dir():
        raise FileNotFoundError(f"policy.pretrained: no such pipeline directory {path}")
    if path.is_dir() and not (path / "model_index.json").is_file():
        raise FileNotFoundError(f"policy.pretrained: {path} is not a diffusers pipeline (no model_index.json)")
    source = str(path) if path.is_dir() else pretrained
    if path.is_dir():
        refuse_pickled_weights(path, "policy.pretrained")
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
            # safetensors only: a pickled component is refused rather than unpickled (it can run code)
            pipe = pipeline_cls.from_pretrained(source, torch_dtype=dtype, local_files_only=local_files_only,
                                                use_safetensors=True, **absent)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise FileNotFoundError(
            f"policy.pretrained: cannot load a diffusers {pipeline_cls.__name__} from {pretrained!r} "
            f"({type(err).__name__}: {err})"
        ) from err
    transformer, vae = pipe.transformer, pipe.vae
    if full_finetune:
        transformer.float()
    log.info("loaded %s pipeline from %s", kind, source)
    return transformer, vae, PipelinePromptEncoder(pipe, adapter, max_sequence_length), dict(pipe.scheduler.config)
