"""Diffusers flow-matching transformers (SD3 / SD3.5, FLUX) as policies in latent space.

policy.py: the nn.Module, built from components. sd3.py, flux.py: how each transformer family
is called (adapter.py picks one). prompt_cache.py: prompt embeddings encoded once. lora.py: what
trains and what checkpoints hold. loading.py: components from a local pipeline directory.
random_model.py: SD3.5-Medium with random weights, for timing.
"""
from jagg_lab.policies.diffusers.adapter import ADAPTERS, KINDS, TransformerAdapter, adapter_class
from jagg_lab.policies.diffusers.flux import FluxAdapter, flux_image_ids, pack_latents, unpack_latents
from jagg_lab.policies.diffusers.loading import PipelinePromptEncoder, load_pipeline
from jagg_lab.policies.diffusers.lora import FLUX_LORA_TARGETS, SD3_LORA_TARGETS
from jagg_lab.policies.diffusers.policy import DTYPES, DiffusersPolicy
from jagg_lab.policies.diffusers.prompt_cache import PromptCache, PromptEncoder
from jagg_lab.policies.diffusers.random_model import SD3_TEXT_LENGTH, SD35_MEDIUM_TRANSFORMER, RandomPromptEncoder
from jagg_lab.policies.diffusers.sd3 import SD3Adapter

__all__ = [
    "DiffusersPolicy",
    "DTYPES",
    "KINDS",
    "ADAPTERS",
    "TransformerAdapter",
    "adapter_class",
    "SD3Adapter",
    "FluxAdapter",
    "pack_latents",
    "unpack_latents",
    "flux_image_ids",
    "PromptEncoder",
    "PromptCache",
    "SD3_LORA_TARGETS",
    "FLUX_LORA_TARGETS",
    "PipelinePromptEncoder",
    "load_pipeline",
    "SD35_MEDIUM_TRANSFORMER",
    "SD3_TEXT_LENGTH",
    "RandomPromptEncoder",
]
