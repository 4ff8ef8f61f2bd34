"""The weight-free SD3.5-Medium timing policy, built from its Hydra config."""
from __future__ import annotations

import torch
from hydra.utils import instantiate

from jagg_lab.policies.diffusers import SD35_MEDIUM_TRANSFORMER


def test_sd3_random_one_layer_from_its_hydra_config(hydra_cfg):
    cfg = hydra_cfg(["policy=sd3_random", "policy.num_layers=1", "policy.resolution=64", "policy.text_length=8",
                     "policy.pos_embed_max_size=8", "policy.dtype=float32"])
    policy = instantiate(cfg.policy)
    config = policy.transformer.config
    for key in ("attention_head_dim", "num_attention_heads", "joint_attention_dim", "caption_projection_dim",
                "pooled_projection_dim", "in_channels", "patch_size", "qk_norm"):
        assert config[key] == SD35_MEDIUM_TRANSFORMER[key], key
    assert config.num_layers == 1 and tuple(config.dual_attention_layers) == (0,)
    assert policy.sample_shape == (16, 8, 8) and policy.has_adapters
    cond = policy.encode_prompts(["a", "b", "a"])
    assert cond["prompt_embeds"].shape == (3, 8, 4096) and cond["pooled"].shape == (3, 2048)
    assert torch.equal(cond["prompt_embeds"][0], cond["prompt_embeds"][2])
    assert not torch.equal(cond["prompt_embeds"][0], cond["prompt_embeds"][1])
    x = torch.randn(3, *policy.sample_shape)
    v = policy(x, torch.rand(3), cond)
    v.square().mean().backward()
    assert v.shape == x.shape and all(p.grad is not None for p in policy.parameters() if p.requires_grad)
    images = policy.decode(x)  # timing-only placeholder
    assert images.shape == (3, 3, 8, 8) and images.min() >= 0 and images.max() <= 1
