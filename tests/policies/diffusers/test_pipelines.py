"""The project's ODE sampling of a diffusers policy equals the diffusers pipeline's own sampling.

Tiny random-weight transformers, the same prompt embeddings (the CFG negative is the null prompt's)
and the same initial noise go through `StableDiffusion3Pipeline` / `FluxPipeline` (latents out)
and through `ode_sample` on the policy's grid (`sampler.schedule=pipeline`). A control samples the
uniform grid at the same shift, which the project used before: it misses the pipeline by ~1e3 x
the tolerance, so these tests fail on that grid.
"""
from __future__ import annotations

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, StableDiffusion3Pipeline

from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.policies.diffusers import pack_latents
from jagg_lab.sampling import SDESampler, noise_schedule, ode_sample
from tests.policies.diffusers.tiny import RESOLUTION, tiny_policy, tiny_transformer

PROMPTS = ["a red circle", "two squares"]
TOLERANCE = 1e-5  # the latents are O(1); batching the CFG branches differently moves them ~5e-7
SD3_STATIC = {"shift": 3.0}  # SD3.5-Medium's scheduler
SD3_DYNAMIC = {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15}
FLUX_DEV = {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
            "base_image_seq_len": 256, "max_image_seq_len": 4096}  # FLUX.1-dev's scheduler
FLUX_SCHNELL = {"shift": 1.0, "use_dynamic_shifting": False}


def project_latents(policy, cond, null, guidance: float, noise: torch.Tensor, num_steps: int, levels=None) -> torch.Tensor:
    """What a rollout's ODE (evaluation) samples: Euler on the sampler's grid for this policy."""
    if levels is None:
        levels = SDESampler(num_steps=num_steps, guidance=guidance).eval_noise_levels(policy)  # schedule null: the pipeline's
    with torch.no_grad():
        return ode_sample(guided_velocity_fn(policy, cond, null, guidance), noise, levels)


def setting(policy, batch: int = 2):
    cond, null = policy.encode_prompts(PROMPTS[:batch]), policy.encode_prompts([""])
    noise = torch.randn((batch, *policy.sample_shape), generator=torch.Generator().manual_seed(0))
    negative = {"negative_prompt_embeds": null["prompt_embeds"].expand(batch, -1, -1),
                "negative_pooled_prompt_embeds": null["pooled"].expand(batch, -1)}
    return cond, null, noise, negative


def assert_matches_pipeline_not_uniform_grid(ours: torch.Tensor, reference: torch.Tensor, uniform: torch.Tensor) -> None:
    assert (ours - reference).abs().max().item() < TOLERANCE
    # control: the uniform grid (shift(linspace(1, 0, T + 1)), the grid before sampler.schedule existed) fails this test
    assert (uniform - reference).abs().max().item() > 100 * TOLERANCE


@pytest.mark.parametrize("scheduler", [SD3_STATIC, SD3_DYNAMIC], ids=["sd3_static_shift", "sd3_dynamic_shift"])
@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_sd3_ode_sampling_equals_stable_diffusion_3_pipeline(scheduler, guidance):
    num_steps = 10
    policy = tiny_policy("sd3", lora=False, scheduler_config=scheduler)
    pipe = StableDiffusion3Pipeline(
        transformer=policy.transformer, scheduler=FlowMatchEulerDiscreteScheduler(**scheduler), vae=policy.vae,
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None, tokenizer_3=None,
    )
    pipe.set_progress_bar_config(disable=True)
    cond, null, noise, negative = setting(policy)
    reference = pipe(
        prompt_embeds=cond["prompt_embeds"], pooled_prompt_embeds=cond["pooled"], **negative, guidance_scale=guidance,
        num_inference_steps=num_steps, latents=noise.clone(), height=RESOLUTION, width=RESOLUTION, output_type="latent",
    ).images
    ours = project_latents(policy, cond, null, guidance, noise, num_steps)
    uniform = project_latents(policy, cond, null, guidance, noise, num_steps, noise_schedule(num_steps, 3.0))
    assert_matches_pipeline_not_uniform_grid(ours, reference, uniform)


@pytest.mark.parametrize("guidance_embed", [None, 3.5], ids=["flux_no_guidance_embedding", "flux_dev_guidance_embedding"])
@pytest.mark.parametrize("true_cfg", [1.0, 2.0])
def test_flux_ode_sampling_equals_flux_pipeline(guidance_embed, true_cfg):
    """FLUX.1-dev's distilled guidance goes in as the pipeline's guidance_scale (policy.guidance_embed),
    true CFG with the null prompt as the pipeline's true_cfg_scale (sampler.guidance); the grid
    shifts dynamically with the image's packed token count, the latents go in and come out 2x2-packed."""
    num_steps = 10
    transformer = tiny_transformer("flux", guidance_embeds=guidance_embed is not None)
    policy = tiny_policy("flux", lora=False, transformer=transformer, guidance_embed=guidance_embed, scheduler_config=FLUX_DEV)
    pipe = FluxPipeline(transformer=policy.transformer, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV),
                        vae=policy.vae, text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    pipe.set_progress_bar_config(disable=True)
    cond, null, noise, negative = setting(policy)
    reference = pipe(
        prompt_embeds=cond["prompt_embeds"], pooled_prompt_embeds=cond["pooled"], **negative, true_cfg_scale=true_cfg,
        guidance_scale=guidance_embed or 0.0, num_inference_steps=num_steps, latents=pack_latents(noise),
        height=RESOLUTION, width=RESOLUTION, output_type="latent",
    ).images  # (B, h/2 * w/2, 4C): FluxPipeline returns latents packed
    ours = pack_latents(project_latents(policy, cond, null, true_cfg, noise, num_steps))
    uniform = pack_latents(project_latents(policy, cond, null, true_cfg, noise, num_steps, noise_schedule(num_steps, 3.0)))
    assert_matches_pipeline_not_uniform_grid(ours, reference, uniform)


def test_flux_schnell_grid_is_the_uniform_grid():
    """FLUX.1-schnell's scheduler (static shift 1): FluxPipeline's linspace(1, 1/T, T), 0 is linspace(1, 0, T + 1)."""
    policy = tiny_policy("flux", lora=False, scheduler_config=FLUX_SCHNELL)
    torch.testing.assert_close(policy.pipeline_schedule.noise_levels(4), noise_schedule(4, 1.0))


def test_sd3_pipeline_grid_follows_the_resolution_only_with_dynamic_shifting():
    small, large = (tiny_policy("sd3", lora=False, scheduler_config=SD3_DYNAMIC, resolution=r) for r in (16, 64))
    assert small.pipeline_schedule.image_seq_len == 16 and large.pipeline_schedule.image_seq_len == 256  # (side / 2 / patch 2)^2
    assert small.pipeline_schedule.mu < large.pipeline_schedule.mu
    assert torch.all(small.pipeline_schedule.noise_levels(6)[1:-1] < large.pipeline_schedule.noise_levels(6)[1:-1])
    static = [tiny_policy("sd3", lora=False, scheduler_config=SD3_STATIC, resolution=r) for r in (16, 64)]
    torch.testing.assert_close(static[0].pipeline_schedule.noise_levels(6), static[1].pipeline_schedule.noise_levels(6))


def test_sd3_and_flux_refuse_a_scheduler_the_project_does_not_reproduce():
    policy = tiny_policy("sd3", lora=False, scheduler_config={"shift": 3.0, "use_karras_sigmas": True})
    with pytest.raises(ValueError, match="use_karras_sigmas.*sampler.schedule=uniform"):
        SDESampler().noise_levels(policy)
    torch.testing.assert_close(SDESampler(schedule="uniform").noise_levels(policy), noise_schedule(10, 1.0))
    policy = tiny_policy("flux", lora=False, scheduler_config={"_class_name": "FlowMatchHeunDiscreteScheduler"})
    with pytest.raises(ValueError, match="FlowMatchHeunDiscreteScheduler"):
        SDESampler().noise_levels(policy)


def test_sd3_module_rollouts_train_on_the_pipeline_grid_and_the_dit_keeps_its_own():
    """The training module's rollouts (and so the trained steps' levels, the KL's reference means
    and the loss) are on the policy's grid; the shapes DiT keeps shift(linspace(1, 0, T + 1))."""
    from tests.conftest import make_module, rollout_and_advantages

    policy = tiny_policy("sd3", lora=False, scheduler_config=SD3_STATIC)
    module = make_module(policy=policy, num_steps=4, shift=1.0, beta=0.04, guidance=2.0)
    rollout, _ = rollout_and_advantages(module, prompts=PROMPTS[:1])
    torch.testing.assert_close(rollout.noise_levels, policy.pipeline_schedule.noise_levels(4))
    assert rollout.ref_means is not None and torch.isfinite(rollout.ref_means).all()
    dit = make_module(num_steps=4, shift=3.0)
    dit_rollout, _ = rollout_and_advantages(dit, prompts=PROMPTS[:1])
    torch.testing.assert_close(dit_rollout.noise_levels, noise_schedule(4, 3.0))
    with pytest.raises(ValueError, match="sampler.schedule=pipeline"):
        type(dit)(policy=dit.policy, sampler=SDESampler(num_steps=4, schedule="pipeline"), reward=dit.reward,
                  strategy=dit.strategy, grpo=dit.grpo, optimizer=dit.optimizer_factory, group_size=4)
