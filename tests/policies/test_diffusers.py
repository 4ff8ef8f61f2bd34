"""DiffusersPolicy on tiny random-config SD3 and FLUX transformers (no weights, no hub).

Every test name carries sd3 or flux (directly or through its parameter id), so
`pytest -k "sd3 or flux"` selects them.
"""
from __future__ import annotations

import copy
import hashlib
import json

import lightning as L
import pytest
import torch
from diffusers import AutoencoderKL, FluxTransformer2DModel, SD3Transformer2DModel
from hydra.utils import instantiate

from jagg_lab.data import PromptDataModule
from jagg_lab.module import AdaptersOff
from jagg_lab.policies import guided_velocity
from jagg_lab.policies.diffusers_policy import (
    SD35_MEDIUM_TRANSFORMER,
    SD3_LORA_TARGETS,
    DiffusersPolicy,
    pack_latents,
    unpack_latents,
)
from jagg_lab.sampling import ode_sample
from jagg_lab.strategies import FullStrategy, JaggRoutedStrategy, JaggStrategy, SubsampleStrategy
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient

KINDS = ["sd3", "flux"]
SD3_CONFIG = dict(
    sample_size=16, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=32, num_attention_heads=4,
    joint_attention_dim=64, caption_projection_dim=128, pooled_projection_dim=64, out_channels=4,
)
FLUX_CONFIG = dict(
    patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False, axes_dims_rope=(4, 4, 8),
)
TEXT_SHAPES = {"sd3": (6, 64, 64), "flux": (6, 32, 32)}  # prompt tokens, embedding dim, pooled dim
RESOLUTION = 16  # pixels; the tiny VAE halves it: latents (4, 8, 8)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread; more only contend with whatever else runs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class StubEncoder:
    """Deterministic per-prompt embeddings of the right shapes; counts what it encodes."""

    def __init__(self, tokens: int, dim: int, pooled: int):
        self.tokens, self.dim, self.pooled = tokens, dim, pooled
        self.encoded: list[str] = []

    def __call__(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        self.encoded += prompts
        rows = []
        for p in prompts:
            g = torch.Generator().manual_seed(int(hashlib.sha256(p.encode()).hexdigest()[:8], 16))
            rows.append((torch.randn(self.tokens, self.dim, generator=g), torch.randn(self.pooled, generator=g)))
        return {"prompt_embeds": torch.stack([r[0] for r in rows]), "pooled": torch.stack([r[1] for r in rows])}


def tiny_transformer(kind: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    if kind == "sd3":
        return SD3Transformer2DModel(**{**SD3_CONFIG, **overrides})
    return FluxTransformer2DModel(**{**FLUX_CONFIG, **overrides})


def tiny_vae(seed: int = 0) -> AutoencoderKL:
    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=RESOLUTION,
        scaling_factor=1.5, shift_factor=0.1,
    )


def tiny_policy(kind: str, *, lora: bool = True, seed: int = 0, transformer=None, **kwargs) -> DiffusersPolicy:
    kwargs.setdefault("resolution", RESOLUTION)
    return DiffusersPolicy.from_components(
        kind, transformer or tiny_transformer(kind, seed), tiny_vae(seed), StubEncoder(*TEXT_SHAPES[kind]), lora_rank=4, lora_alpha=8, lora_target_modules=SD3_LORA_TARGETS if lora else None, **kwargs,
    )


def activate_lora(policy: DiffusersPolicy, seed: int = 1, std: float = 0.05) -> None:
    """LoRA B starts at zero, which leaves A without gradient; small random B exercises both."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def inputs(policy: DiffusersPolicy, batch: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, *policy.sample_shape), generator=g)
    s = torch.rand(batch, generator=g)
    return x, s, policy.encode_prompts(["a red circle", "two squares", "a red circle"][:batch])


# ---- geometry, conventions, prompt cache -------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_latent_shapes_decode_and_prompt_cache(kind):
    policy = tiny_policy(kind)
    assert policy.sample_shape == (4, 8, 8)
    x, s, cond = inputs(policy)
    assert cond["prompt_embeds"].shape == (3, *TEXT_SHAPES[kind][:2]) and cond["pooled"].shape == (3, TEXT_SHAPES[kind][2])
    v = policy(x, s, cond)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    # one encoder call per distinct prompt, ever: repeats and later calls come from the cache
    encoder = policy._frozen.prompt_encoder
    policy.encode_prompts(["two squares", ""] * 4)
    policy.encode_prompts([""])
    assert sorted(encoder.encoded) == sorted(["a red circle", "two squares", ""])
    assert torch.equal(policy.encode_prompts(["a red circle"])["pooled"][0], cond["pooled"][0])
    images = policy.decode(x)
    assert images.shape == (3, 3, RESOLUTION, RESOLUTION) and images.min() >= 0 and images.max() <= 1
    # decode undoes the pipeline's latent normalisation: z / scaling_factor + shift_factor
    vae = policy.vae
    expected = ((vae.decode(x[:1] / 1.5 + 0.1).sample + 1) / 2).clamp(0, 1)
    torch.testing.assert_close(images[:1], expected)


def test_flux_pack_unpack_roundtrip():
    x = torch.randn(2, 4, 6, 8)
    tokens = pack_latents(x)
    assert tokens.shape == (2, 12, 16)
    assert torch.equal(unpack_latents(tokens, 6, 8), x)


@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_ode_matches_the_diffusers_pipeline_with_cfg(kind):
    """Same noise, same noise levels, CFG 4.5: our Euler ODE over the policy reproduces the
    diffusers pipeline's own sampling loop. This pins the timestep scaling (SD3: s * 1000,
    FLUX: s), the velocity sign, FLUX packing and position ids, and the CFG formula."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, StableDiffusion3Pipeline

    policy = tiny_policy(kind, lora=False)
    cond, null = policy.encode_prompts(["a red circle", "two squares"]), policy.encode_prompts([""])
    noise = torch.randn((2, *policy.sample_shape), generator=torch.Generator().manual_seed(0))
    sigmas = [1.0, 0.75, 0.4]
    ours = ode_sample(
        lambda x, s: guided_velocity(policy, x, s, cond, null, 4.5), noise, torch.tensor(sigmas + [0.0])
    )
    common = dict(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=policy.vae, transformer=policy.transformer,
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
    )
    embeds = dict(
        prompt_embeds=cond["prompt_embeds"], pooled_prompt_embeds=cond["pooled"],
        negative_prompt_embeds=null["prompt_embeds"].expand(2, -1, -1), negative_pooled_prompt_embeds=null["pooled"].expand(2, -1),
    )
    with torch.no_grad():
        if kind == "sd3":
            pipe = StableDiffusion3Pipeline(**common, text_encoder_3=None, tokenizer_3=None)
            theirs = pipe(**embeds, guidance_scale=4.5, sigmas=sigmas, num_inference_steps=len(sigmas), height=RESOLUTION,
                          width=RESOLUTION, latents=noise, output_type="latent").images
        else:
            pipe = FluxPipeline(**common)
            packed = pipe(**embeds, true_cfg_scale=4.5, sigmas=sigmas, num_inference_steps=len(sigmas), height=RESOLUTION,
                          width=RESOLUTION, latents=pack_latents(noise), output_type="latent").images
            theirs = unpack_latents(packed, *policy.sample_shape[1:])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


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


# ---- LoRA: what trains, and the reference ---------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_lora_trains_only_adapters(kind):
    policy = tiny_policy(kind)
    activate_lora(policy)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in policy.parameters() if p.requires_grad)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    module = make_module(guidance=4.5, num_steps=4, policy=policy)
    rollout, advantages = rollout_and_advantages(module)
    module.strategy = JaggStrategy(window=2)
    module.micro_batch_backward(rollout, advantages, torch.arange(8), 1.0, on_policy=True)
    for n, p in policy.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
        else:
            assert p.grad is None, n
    torch.optim.AdamW(module.trainable_parameters(), lr=1e-2).step()
    params = dict(policy.named_parameters())
    assert all(torch.equal(params[n], v) for n, v in base.items())
    assert any(not torch.equal(params[n], v) for n, v in lora.items())


@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_adapters_disabled_is_the_base_model_and_the_kl_reference(kind):
    policy = tiny_policy(kind)
    pristine = copy.deepcopy(policy.transformer)  # LoRA B = 0: the base model's function
    x, s, cond = inputs(policy)
    with torch.no_grad():
        before = policy(x, s, cond)
    module = make_module(guidance=4.5, beta=0.05, num_steps=4, policy=policy)
    assert isinstance(module.ref_policy, AdaptersOff)  # no second copy of the model
    rollout, advantages = rollout_and_advantages(module)
    assert rollout.ref_means is not None
    # on-policy at init: the reference is the policy itself, so KL is zero
    strategy_gradient(module, FullStrategy(), rollout, advantages)
    assert module.step_metrics["kl"].compute().abs() < 1e-10
    for m in module.step_metrics.values():
        m.reset()
    opt = torch.optim.AdamW(module.trainable_parameters(), lr=5e-2)
    for _ in range(2):
        module.strategy = FullStrategy()
        module.micro_batch_backward(rollout, advantages, torch.arange(8), 1.0, on_policy=True)
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        after = policy(x, s, cond)
        with policy.adapters_disabled():
            with policy.adapters_disabled():  # nests
                off_inner = policy(x, s, cond)
            off = policy(x, s, cond)
        again = policy(x, s, cond)
    assert rel_err(after, before) > 1e-4  # the LoRA learned something
    torch.testing.assert_close(off, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(off_inner, before, rtol=0, atol=1e-6)
    torch.testing.assert_close(again, after)  # adapters are back on after the block
    # the reference really is the untouched base model
    reference = DiffusersPolicy.from_components(kind, pristine, None, policy._frozen.prompt_encoder, resolution=RESOLUTION,
                                                lora_target_modules=None, vae_scale_factor=2)
    with torch.no_grad():
        torch.testing.assert_close(reference(x, s, cond), before, rtol=0, atol=1e-6)
    # a fresh rollout now has a reference that differs from the policy: KL > 0, finite
    rollout, advantages = rollout_and_advantages(module, seed=1)
    strategy_gradient(module, FullStrategy(), rollout, advantages)
    kl = module.step_metrics["kl"].compute()
    assert torch.isfinite(kl) and kl > 0


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
    assert module.ref_policy is not policy and module.ref_policy._frozen is policy._frozen  # VAE/encoder shared


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


# ---- errors name the bad key --------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_sd3_flux_bad_config_fails_naming_the_key(kind, tmp_path):
    with pytest.raises(ValueError, match="policy.pretrained"):
        DiffusersPolicy(kind=kind, pretrained=None)
    with pytest.raises(FileNotFoundError, match="policy.pretrained.*no such"):
        DiffusersPolicy(kind=kind, pretrained=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="policy.pretrained.*model_index.json"):
        DiffusersPolicy(kind=kind, pretrained=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="policy.pretrained"):
        DiffusersPolicy(kind=kind, pretrained="nobody/not-in-the-local-cache")
    with pytest.raises(ValueError, match="policy.kind"):
        DiffusersPolicy(kind="sdxl", pretrained=str(tmp_path))
    with pytest.raises(ValueError, match="policy.dtype"):
        tiny_policy(kind, dtype="float64")
    with pytest.raises(ValueError, match="policy.resolution"):
        tiny_policy(kind, resolution=18)  # not a multiple of VAE scale 2 x patch 2
    with pytest.raises(ValueError, match="policy.lora_target_modules"):
        DiffusersPolicy.from_components(kind, tiny_transformer(kind), tiny_vae(), StubEncoder(*TEXT_SHAPES[kind]),
                                        resolution=RESOLUTION, lora_target_modules=["no_such_module"])


# ---- a real local pipeline directory ---------------------------------------------------------------
def _tiny_clip_tokenizer():
    from open_clip.tokenizer import bytes_to_unicode
    from transformers import CLIPTokenizer

    chars = list(bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77), len(vocab)


def test_sd3_loads_a_local_pipeline_directory_and_uses_its_encode_prompt(tmp_path):
    """The config path: DiffusersPolicy(kind=sd3, pretrained=DIR) on a saved tiny SD3 pipeline
    (two tiny CLIP text encoders, no T5, as diffusers allows)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    tokenizer, vocab_size = _tiny_clip_tokenizer()
    torch.manual_seed(0)

    def text_encoder():
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=vocab_size, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=77, projection_dim=32, bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1,
            pad_token_id=vocab_size - 1,
        ))

    pipe = StableDiffusion3Pipeline(
        transformer=tiny_transformer("sd3"), scheduler=FlowMatchEulerDiscreteScheduler(), vae=tiny_vae(),
        text_encoder=text_encoder(), tokenizer=tokenizer, text_encoder_2=text_encoder(), tokenizer_2=tokenizer,
        text_encoder_3=None, tokenizer_3=None,
    )
    pipe.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "model_index.json").read_text())["text_encoder_3"] == [None, None]
    policy = DiffusersPolicy(kind="sd3", pretrained=str(tmp_path), resolution=RESOLUTION, dtype="float32",
                             lora_rank=4, lora_alpha=8, lora_target_modules=list(SD3_LORA_TARGETS), max_sequence_length=8)
    cond = policy.encode_prompts(["a red circle", ""])
    embeds, _, pooled, _ = pipe.encode_prompt(prompt=["a red circle", ""], prompt_2=None, prompt_3=None, device="cpu",
                                              do_classifier_free_guidance=False, max_sequence_length=8)
    torch.testing.assert_close(cond["prompt_embeds"], embeds)
    torch.testing.assert_close(cond["pooled"], pooled)
    assert cond["prompt_embeds"].shape == (2, 77 + 8, 64)  # CLIP tokens, then (absent, zero) T5 tokens
    x = torch.randn(2, *policy.sample_shape)
    s = torch.tensor([0.9, 0.3])
    with torch.no_grad():
        expected = pipe.transformer(hidden_states=x, encoder_hidden_states=embeds, pooled_projections=pooled,
                                    timestep=s * 1000, return_dict=False)[0]
        torch.testing.assert_close(policy(x, s, cond), expected)  # LoRA B = 0: the pipeline's transformer
    assert policy.has_adapters and all("lora_" in n for n, p in policy.named_parameters() if p.requires_grad)


# ---- checkpoints: a LoRA policy saves only its adapters ---------------------------------------------
def test_sd3_lightning_step_and_lora_only_checkpoint_resume(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\ntwo squares\n")
    policy = tiny_policy("sd3")
    module = make_module(guidance=4.5, num_steps=3, policy=policy, micro_batch_size=4)
    data = PromptDataModule(source="file", prompt_file=str(prompts), prompts_per_step=1, group_size=4)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    assert module.rollouts_done == 1 and module.skipped_steps == 0
    ckpt_path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt_path)
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)["state_dict"]
    lora_keys = {f"policy.{n}" for n, p in policy.named_parameters() if p.requires_grad}
    assert set(state) == lora_keys  # no frozen base weights, no pos_embed buffer
    # resume: a policy rebuilt from the same base loads the adapters strictly
    fresh = make_module(guidance=4.5, num_steps=3, policy=tiny_policy("sd3"), micro_batch_size=4)
    fresh.load_state_dict(state, strict=True)
    for (n, a), b in zip(fresh.policy.named_parameters(), policy.parameters()):
        assert torch.equal(a, b), n
    # checkpoint_frozen=True writes everything
    full = tiny_policy("sd3", checkpoint_frozen=True)
    assert set(full.state_dict()) == set(full.transformer.state_dict(prefix="transformer."))


# ---- the weight-free SD3.5-Medium timing policy ---------------------------------------------------
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
