"""FLUX specifics: 2x2 latent packing and the guidance embedding."""
from __future__ import annotations

import copy

import pytest
import torch

from jagg_lab.policies.diffusers import pack_latents, unpack_latents
from tests.policies.diffusers.tiny import inputs, rel_err, tiny_policy, tiny_transformer


def test_flux_pack_unpack_roundtrip():
    x = torch.randn(2, 4, 6, 8)
    tokens = pack_latents(x)
    assert tokens.shape == (2, 12, 16)
    assert torch.equal(unpack_latents(tokens, 6, 8), x)


def test_flux_guidance_embedding_is_required_and_used():
    transformer = tiny_transformer("flux", guidance_embeds=True)
    with pytest.raises(ValueError, match="policy.guidance_embed"):
        tiny_policy("flux", transformer=transformer)
    low = tiny_policy("flux", transformer=copy.deepcopy(transformer), guidance_embed=1.0)
    high = tiny_policy("flux", transformer=copy.deepcopy(transformer), guidance_embed=3.5)
    x, s, cond = inputs(low)
    with torch.no_grad():
        assert rel_err(low(x, s, cond), high(x, s, cond)) > 1e-4
    with pytest.raises(ValueError, match="policy.guidance_embed"):
        tiny_policy("flux", guidance_embed=3.5)  # a transformer without guidance embedding
