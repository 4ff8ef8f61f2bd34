"""Noise schedules, pure SDE/ODE steps with log-probs, and rollouts."""
from jagg_lab.sampling.rollout import VelocityFn, ode_sample, sde_rollout, shard_noise
from jagg_lab.sampling.schedule import noise_schedule, shift_noise_levels
from jagg_lab.sampling.sde import SDEStep, gaussian_log_prob, ode_step, sde_mean, sde_std, sde_step, transition_kl
from jagg_lab.sampling.sampler import SDESampler

__all__ = [
    "VelocityFn", "ode_sample", "sde_rollout", "shard_noise", "noise_schedule", "shift_noise_levels",
    "SDEStep", "gaussian_log_prob", "ode_step", "sde_mean", "sde_std", "sde_step", "transition_kl", "SDESampler",
]
