"""The two noise grids: the pipeline's equals diffusers' FlowMatchEulerDiscreteScheduler, and which
grid a policy gets (sampler.schedule, sampler.shift) is decided, or refused, by clear rules."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from jagg_lab.sampling import PipelineSchedule, SDESampler, noise_schedule, sampling_levels
from jagg_lab.sampling.schedule import calculate_shift, time_shift

DYNAMIC = {"use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
           "max_image_seq_len": 4096}


@pytest.mark.parametrize("num_steps", [1, 2, 10, 28, 40])
@pytest.mark.parametrize("shift", [1.0, 3.0, 5.0])
def test_sd3_spacing_equals_the_scheduler_sigmas(num_steps, shift):
    """StableDiffusion3Pipeline calls set_timesteps(num_steps): its sigmas, exactly."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(num_steps)
    ours = PipelineSchedule("sd3", image_seq_len=1024, shift=shift).noise_levels(num_steps)
    assert torch.equal(ours, scheduler.sigmas)


@pytest.mark.parametrize("spacing", ["sd3", "flux"])
@pytest.mark.parametrize("image_seq_len", [16, 1024, 4096, 8192])
@pytest.mark.parametrize("time_shift_type", ["exponential", "linear"])
def test_dynamic_shifting_equals_the_scheduler_sigmas(spacing, image_seq_len, time_shift_type):
    """With dynamic shifting the pipelines pass mu = calculate_shift(tokens); FluxPipeline also
    passes sigmas = linspace(1, 1/T, T)."""
    config = {**DYNAMIC, "time_shift_type": time_shift_type}
    ours = PipelineSchedule(spacing, image_seq_len=image_seq_len, **config)
    mu = calculate_shift(image_seq_len, 256, 4096, 0.5, 1.15)
    assert ours.mu == pytest.approx(0.5 + (image_seq_len - 256) * 0.65 / 3840, abs=1e-12)
    for num_steps in (1, 4, 28):
        scheduler = FlowMatchEulerDiscreteScheduler(**config)
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps) if spacing == "flux" else None
        scheduler.set_timesteps(num_steps, sigmas=sigmas, mu=mu)
        assert torch.equal(ours.noise_levels(num_steps), scheduler.sigmas)


def test_pipeline_grid_closed_form_at_sd35m_settings():
    """SD3.5-M (shift 3), 10 steps: shift(linspace(1, shift(0.001), 10)), then 0; its last non-zero
    level is 0.0089, the uniform grid's 0.25."""
    shift = lambda s: 3 * s / (1 + 2 * s)  # noqa: E731
    levels = PipelineSchedule("sd3", image_seq_len=1024, shift=3.0).noise_levels(10)
    expected = [shift(s) for s in np.linspace(1, shift(0.001), 10)] + [0.0]
    np.testing.assert_allclose(levels.numpy(), expected, rtol=1e-6)
    assert levels[-2].item() == pytest.approx(0.00893, abs=1e-5) and noise_schedule(10, 3.0)[-2].item() == pytest.approx(0.25)


def test_time_shift_closed_forms():
    s = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    torch.testing.assert_close(time_shift(s, 0.0), s)  # mu = 0: identity
    torch.testing.assert_close(time_shift(s, math.log(3.0)), 3 * s / (1 + 2 * s))  # e^mu = 3: the static shift 3
    torch.testing.assert_close(time_shift(s, 2.0, "linear"), 2 / (2 + 1 / s - 1))
    with pytest.raises(ValueError, match="time_shift_type"):
        time_shift(s, 1.0, "cosine")


def test_scheduler_config_refusals_name_the_option():
    with pytest.raises(ValueError, match="shift_terminal"):
        PipelineSchedule.from_scheduler_config({"shift": 3.0, "shift_terminal": 0.1}, "sd3", 1024)
    with pytest.raises(ValueError, match="UniPCMultistepScheduler.*sampler.schedule=uniform"):
        PipelineSchedule.from_scheduler_config({"_class_name": "UniPCMultistepScheduler"}, "sd3", 1024)
    with pytest.raises(ValueError, match="spacing"):
        PipelineSchedule("sdxl", image_seq_len=16)
    read = PipelineSchedule.from_scheduler_config({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0,
                                                   "_diffusers_version": "0.31.0", "max_shift": None}, "flux", 64)
    assert (read.shift, read.max_shift, read.image_seq_len, read.spacing) == (3.0, 1.15, 64, "flux")


PIPELINE_POLICY = SimpleNamespace(pipeline_schedule=PipelineSchedule("sd3", image_seq_len=1024, shift=3.0))
DYNAMIC_POLICY = SimpleNamespace(pipeline_schedule=PipelineSchedule("flux", image_seq_len=1024, **DYNAMIC))
DIT_POLICY = SimpleNamespace()  # no pipeline: the shapes DiT


def test_schedule_null_is_the_policys_own_grid():
    torch.testing.assert_close(SDESampler(shift=3.0).noise_levels(DIT_POLICY), noise_schedule(10, 3.0))
    torch.testing.assert_close(SDESampler().noise_levels(PIPELINE_POLICY), PIPELINE_POLICY.pipeline_schedule.noise_levels(10))
    torch.testing.assert_close(SDESampler(schedule="uniform").noise_levels(PIPELINE_POLICY), noise_schedule(10, 1.0))
    sampler = SDESampler(num_steps=10, eval_num_steps=40)
    torch.testing.assert_close(sampler.eval_noise_levels(PIPELINE_POLICY), PIPELINE_POLICY.pipeline_schedule.noise_levels(40))


def test_pipeline_schedule_refusals_name_the_key():
    with pytest.raises(ValueError, match="sampler.schedule=pipeline.*not come from a diffusers pipeline"):
        SDESampler(schedule="pipeline").noise_levels(DIT_POLICY)
    with pytest.raises(ValueError, match="sampler.schedule must be one of"):
        SDESampler(schedule="karras")
    with pytest.raises(ValueError, match="sampler.shift=2.0.*shifts by 3.0"):
        SDESampler(shift=2.0).noise_levels(PIPELINE_POLICY)
    with pytest.raises(ValueError, match="sampler.shift=3.0.*dynamically"):
        SDESampler(shift=3.0).noise_levels(DYNAMIC_POLICY)
    # the pipeline's own shift, stated explicitly, is accepted and changes nothing
    torch.testing.assert_close(SDESampler(shift=3.0).noise_levels(PIPELINE_POLICY), SDESampler().noise_levels(PIPELINE_POLICY))
    with pytest.raises(ValueError, match="heldout.schedule"):
        sampling_levels(4, schedule="pipeline", shift=1.0, policy=DIT_POLICY, key="heldout")
