"""The SD3 and FLUX adapters call their transformers exactly as the diffusers pipelines do."""
from __future__ import annotations

import pytest
import torch

from jagg_lab.policies import guided_velocity
from jagg_lab.policies.diffusers import pack_latents, unpack_latents
from jagg_lab.sampling import ode_sample
from tests.policies.diffusers.tiny import KINDS, RESOLUTION, tiny_policy


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
