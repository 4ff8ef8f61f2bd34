"""Each distinct prompt is encoded once; the cache is an LRU of CPU rows."""
from __future__ import annotations

import pytest
import torch

from jagg_lab.policies.diffusers import PromptCache
from tests.policies.diffusers.tiny import KINDS, TEXT_SHAPES, StubEncoder, inputs, tiny_policy

CPU = torch.device("cpu")


@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_policy_encodes_each_prompt_once(kind):
    policy = tiny_policy(kind)
    _, _, cond = inputs(policy)
    # one encoder call per distinct prompt, ever: repeats and later calls come from the cache
    encoder = policy._frozen.prompt_cache.encoder
    policy.encode_prompts(["two squares", ""] * 4)
    policy.encode_prompts([""])
    assert sorted(encoder.encoded) == sorted(["a red circle", "two squares", ""])
    assert torch.equal(policy.encode_prompts(["a red circle"])["pooled"][0], cond["pooled"][0])


def test_sd3_prompt_cache_evicts_the_least_recently_used():
    encoder = StubEncoder(*TEXT_SHAPES["sd3"])
    cache = PromptCache(encoder, size=2)
    first = cache(["a", "b", "a"], CPU)
    assert encoder.encoded == ["a", "b"] and torch.equal(first["pooled"][0], first["pooled"][2])
    cache(["a"], CPU)  # "b" is now the least recently used
    cache(["c"], CPU)
    assert list(cache.rows) == ["a", "c"]
    cache(["a", "b"], CPU)
    assert encoder.encoded == ["a", "b", "c", "b"]
    uncached = PromptCache(StubEncoder(*TEXT_SHAPES["sd3"]), size=0)
    uncached(["a", "a"], CPU)
    uncached(["a"], CPU)
    assert uncached.encoder.encoded == ["a", "a"] and not uncached.rows
    with pytest.raises(ValueError, match="policy.prompt_cache_size"):
        PromptCache(encoder, size=-1)
