"""Noise schedules, pure SDE/ODE steps with log-probs, and rollouts."""
from jagg_lab.sampling.rollout import VelocityFn, ode_sample, sde_rollout, shard_noise
from jagg_lab.sampling.schedule import PipelineSchedule, noise_schedule, sampling_levels, shift_noise_levels
from jagg_lab.sampling.sde import (SDEStep, gaussian_log_prob, kl_penalty, ode_step, sde_mean, sde_std, sde_step,
                                   transition_kl)
from jagg_lab.sampling.sampler import SDESampler

__all__ = [
    "VelocityFn", "ode_sample", "sde_rollout", "shard_noise", "noise_schedule", "shift_noise_levels",
    "PipelineSchedule", "sampling_levels", "SDEStep", "gaussian_log_prob", "kl_penalty", "ode_step", "sde_mean",
    "sde_std", "sde_step", "transition_kl", "SDESampler",
]
