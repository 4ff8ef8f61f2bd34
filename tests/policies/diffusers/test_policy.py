"""DiffusersPolicy on tiny SD3 and FLUX transformers: geometry, decode, GRPO through the module, dtypes, errors."""
from __future__ import annotations

import pytest
import torch

from jagg_lab.policies.diffusers import DiffusersPolicy
from jagg_lab.strategies import FullStrategy, JaggRoutedStrategy, JaggStrategy, SubsampleStrategy
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient
from tests.policies.diffusers.tiny import (
    KINDS,
    RESOLUTION,
    TEXT_SHAPES,
    StubEncoder,
    activate_lora,
    inputs,
    rel_err,
    tiny_policy,
    tiny_transformer,
    tiny_vae,
)


@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_latent_shapes_and_decode(kind):
    policy = tiny_policy(kind)
    assert policy.sample_shape == (4, 8, 8)
    x, s, cond = inputs(policy)
    assert cond["prompt_embeds"].shape == (3, *TEXT_SHAPES[kind][:2]) and cond["pooled"].shape == (3, TEXT_SHAPES[kind][2])
    v = policy(x, s, cond)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    images = policy.decode(x)
    assert images.shape == (3, 3, RESOLUTION, RESOLUTION) and images.min() >= 0 and images.max() <= 1
    # decode undoes the pipeline's latent normalisation: z / scaling_factor + shift_factor
    vae = policy.vae
    expected = ((vae.decode(x[:1] / 1.5 + 0.1).sample + 1) / 2).clamp(0, 1)
    torch.testing.assert_close(images[:1], expected)


# ---- GRPO through the Lightning module ----------------------------------------------------------
STRATEGIES = {
    "full": lambda: FullStrategy(),
    "jagg": lambda: JaggStrategy(window=2, mode="cached"),
    "jagg_routed": lambda: JaggRoutedStrategy(window=2, cos_threshold=0.5),
    "subsample": lambda: SubsampleStrategy(window=2, choice="fixed"),
}


@pytest.fixture(scope="module", params=KINDS)
def cfg_rollout(request):
    """A tiny LoRA policy along a real 4-step SDE rollout with CFG 4.5 (fp32)."""
    policy = tiny_policy(request.param)
    activate_lora(policy)
    module = make_module(guidance=4.5, num_steps=4, policy=policy)
    rollout, advantages = rollout_and_advantages(module)
    return request.param, module, rollout, advantages


def test_sd3_flux_grpo_step_with_every_strategy_gives_finite_gradients(cfg_rollout):
    _, module, rollout, advantages = cfg_rollout
    for name, make in STRATEGIES.items():
        grad, stats = strategy_gradient(module, make(), rollout, advantages)
        assert grad.numel() == sum(p.numel() for p in module.trainable_parameters())
        assert torch.isfinite(grad).all() and grad.norm() > 0, name
        assert stats["backward_passes"] >= 1, name


def test_sd3_flux_jagg_w2_equals_full_with_cfg(cfg_rollout):
    _, module, rollout, advantages = cfg_rollout
    full, _ = strategy_gradient(module, FullStrategy(), rollout, advantages)
    for mode in ("recompute", "cached"):
        jagg, stats = strategy_gradient(module, JaggStrategy(window=2, mode=mode), rollout, advantages)
        assert rel_err(jagg, full) < 1e-4, mode
        assert stats["backward_passes"] == 2  # 4 trained steps, windows of 2


# ---- dtypes and what trains -----------------------------------------------------------------------
def test_sd3_bfloat16_autocast_keeps_lora_in_float32():
    policy = tiny_policy("sd3", dtype="bfloat16")
    activate_lora(policy)
    assert {p.dtype for p in policy.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in policy.parameters() if not p.requires_grad} == {torch.bfloat16}
    x, s, cond = inputs(policy)
    v = policy(x, s, cond)
    assert v.dtype == torch.float32 and torch.isfinite(v).all()
    v.square().mean().backward()
    grads = [p.grad for p in policy.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


def test_sd3_full_finetune_without_lora_trains_float32_transformer():
    policy = tiny_policy("sd3", lora=False, dtype="bfloat16")
    assert not policy.has_adapters
    assert all(p.requires_grad and p.dtype == torch.float32 for p in policy.transformer.parameters())
    with pytest.raises(RuntimeError, match="no LoRA adapters"):
        with policy.adapters_disabled():
            pass
    module = make_module(beta=0.05, num_steps=2, policy=policy)  # KL reference: a frozen copy
    assert module.objective.ref_policy is not policy and module.objective.ref_policy._frozen is policy._frozen  # VAE/encoder shared


# ---- errors name the bad key --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_bad_config_fails_naming_the_key(kind):
    with pytest.raises(ValueError, match="policy.kind"):
        DiffusersPolicy("sdxl", tiny_transformer(kind), tiny_vae(), StubEncoder(*TEXT_SHAPES[kind]), resolution=RESOLUTION)
    with pytest.raises(ValueError, match="policy.dtype"):
        tiny_policy(kind, dtype="float64")
    with pytest.raises(ValueError, match="policy.resolution"):
        tiny_policy(kind, resolution=18)  # not a multiple of VAE scale 2 x patch 2
    with pytest.raises(ValueError, match="policy.lora_target_modules"):
        DiffusersPolicy(kind, tiny_transformer(kind), tiny_vae(), StubEncoder(*TEXT_SHAPES[kind]),
                        resolution=RESOLUTION, lora_target_modules=["no_such_module"])
