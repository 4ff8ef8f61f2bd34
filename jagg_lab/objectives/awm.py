"""AWM, Advantage Weighted Matching (arXiv 2509.25050): the flow-matching loss on the policy's
own samples as the likelihood of a policy gradient, weighted by the GRPO advantage.

Per sample x0 (an ODE rollout) and each of its K training states x_s = (1 - s) x0 + s eps:

    mse        = mean over dimensions of (v_theta(x_s, s) - (eps - x0))^2
    log p      = -mse (uniform) | -s mse (t) | -s ((mse + 1e-10)^p - 1e-10^p) / p (ghuber)
    ratio      = exp(log p - log p_old)   (exactly 1 on-policy: the published default)
    loss       = mean of max(-A ratio, -A clip(ratio, 1 - c, 1 + c))
                 + kl_weight mean ||v_theta - v_ref||^2 + ema_weight mean ||v_theta - v_ema||^2

A: the group advantage (group mean, global std, clipped to +-clip_max) divided by clip_max, in
[-1, 1]. v_ref: the starting policy; v_ema: a soft copy of the weights, theta_ema <- d theta_ema +
(1 - d) theta after each rollout with d = min(ema_cap, ema_rate * optimizer steps). The K levels
are stratified over the rollout grid's indices: K strata of [first, int(T * max_fraction)) (first
= 1 leaves out s = 1, the published `discrete_wo_init`), one index drawn per stratum, per sample.
"""
from __future__ import annotations

import logging

from dataclasses import replace
from typing import Sequence

import torch
from torch import nn

from jagg_lab.grpo.loss import StepStats
from jagg_lab.objectives.forward import (
    ForwardObjective, Samples, SoftCopy, check_fraction, check_schedule, check_positive_int, grid_levels, noised, soft_update_rate,
    stats_of,
)

__all__ = ["AWM", "WEIGHTINGS", "awm_log_prob", "stratified_indices"]

log = logging.getLogger(__name__)

WEIGHTINGS = ("uniform", "t", "ghuber")


def awm_log_prob(v: torch.Tensor, target: torch.Tensor, s: torch.Tensor, weighting: str = "ghuber",
                 power: float = 0.25) -> torch.Tensor:
    """AWM's surrogate log-likelihood of each sample at its state, (B,): minus the weighted
    flow-matching error of the velocity v against the target eps - x0 at noise level s (B,)."""
    mse = (v.float() - target.float()).pow(2).flatten(1).mean(1)
    s = s.float()
    if weighting == "uniform":
        return -mse
    if weighting == "t":
        return -s * mse
    if weighting == "ghuber":
        return -((mse + 1e-10) ** power - 1e-10**power) * s / power
    raise ValueError(f"objective.weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def stratified_indices(batch: int, num_levels: int, k: int, max_fraction: float, first: int,
                       generator: torch.Generator) -> torch.Tensor:
    """(batch, k) grid indices, one drawn uniformly from each of k strata of [first, int(T *
    max_fraction)) (T = num_levels); a stratum narrower than one index keeps its start."""
    end = max(first + 1, int(num_levels * max_fraction))
    bounds = torch.linspace(first, end, k + 1, dtype=torch.float64).long()
    low, high = bounds[:-1], torch.maximum(bounds[1:], bounds[:-1] + 1)
    u = torch.rand((batch, k), generator=generator, dtype=torch.float64)
    return (low + (u * (high - low)).floor().long()).clamp(max=num_levels - 1)


class AWM(ForwardObjective):
    """timesteps_per_sample: K training states per sample. max_fraction, include_first: the grid
    indices they are drawn from (see the module docstring). weighting, ghuber_power: the
    surrogate log-likelihood. clip_range: the ratio's clip (acts only on off-policy steps,
    grpo.optimizer_steps_per_rollout > 1). kl_weight, ema_weight, ema_rate, ema_cap: the
    regularisers; as in the authors' code, the EMA term is applied only beside a KL term (it sits
    inside their `if beta > 0`): with kl_weight 0 it is off whatever ema_weight says (logged).
    solver: the rollouts' ODE solver. Published (GenEval): K 6, 0.9, without s = 1, ghuber 0.25,
    clip 1, kl 0.001, ema 1 at min(0.3, 0.001 step)."""

    name = "awm"

    def __init__(self, timesteps_per_sample: int = 6, max_fraction: float = 0.9, include_first: bool = False,
                 weighting: str = "ghuber", ghuber_power: float = 0.25, clip_range: float = 1.0,
                 kl_weight: float = 0.001, ema_weight: float = 1.0, ema_rate: float = 0.001, ema_cap: float = 0.3,
                 solver: str = "euler"):
        super().__init__(solver=solver, kl_weight=kl_weight)
        check_positive_int(timesteps_per_sample, "objective.timesteps_per_sample")
        check_fraction(max_fraction, "objective.max_fraction")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"objective.weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        if ghuber_power <= 0:
            raise ValueError(f"objective.ghuber_power must be > 0, got {ghuber_power}")
        if clip_range <= 0:
            raise ValueError(f"objective.clip_range must be > 0, got {clip_range}")
        check_schedule(ema_rate=ema_rate, ema_cap=ema_cap)
        if ema_weight < 0:
            raise ValueError(f"objective.ema_weight must be >= 0, got {ema_weight}")
        self.k, self.max_fraction, self.first = timesteps_per_sample, max_fraction, 0 if include_first else 1
        self.weighting, self.power, self.clip_range = weighting, ghuber_power, clip_range
        if ema_weight > 0 and kl_weight == 0:
            log.info("objective.ema_weight = %g is not used: AWM applies its EMA term only with a KL term "
                     "(objective.kl_weight > 0), as its authors' code does", ema_weight)
            ema_weight = 0.0
        self.ema_weight, self.ema_rate, self.ema_cap = ema_weight, ema_rate, ema_cap
        self.ema: SoftCopy | None = None

    def attach(self, policy, params, guidance, ref_policy=None) -> None:
        super().attach(policy, params, guidance, ref_policy)
        self.ema = SoftCopy(params) if self.ema_weight > 0 else None

    def draw_levels(self, batch, noise_levels, generator) -> torch.Tensor:
        grid = grid_levels(noise_levels)
        if self.first >= len(grid):
            raise ValueError(f"objective.include_first=false leaves no level of a {len(grid)}-step grid")
        return grid[stratified_indices(batch, len(grid), self.k, self.max_fraction, self.first, generator)].float()

    def sample_weights(self, advantages, clip_max) -> torch.Tensor:
        return advantages.clamp(-clip_max, clip_max) / clip_max

    def _state(self, samples: Samples, idx: torch.Tensor, j: int):
        x0, eps, s = samples.final[idx], samples.noise[idx, j], samples.levels[idx, j]
        return noised(x0, eps, s), s, eps - x0

    def prepare(self, policy, samples: Samples, off_policy: bool, micro_batch_size: int) -> Samples:
        """Off-policy optimizer steps compare with the sampling policy's log-probs at the same states
        (computed here, before any update, micro-batch by micro-batch)."""
        if not off_policy:
            return samples
        old = torch.empty_like(samples.levels)
        with torch.no_grad():
            for idx in torch.arange(samples.final.shape[0], device=samples.final.device).split(micro_batch_size):
                for j in range(samples.levels.shape[1]):
                    x, s, target = self._state(samples, idx, j)
                    old[idx, j] = awm_log_prob(self.velocity(policy, samples, idx, x, s), target, s, self.weighting,
                                               self.power)
        return replace(samples, old_log_probs=old)

    def state_loss(self, policy, params, samples, idx, j, weights, on_policy) -> tuple[torch.Tensor, StepStats, int]:
        x, s, target = self._state(samples, idx, j)
        calls = 0
        v_ref = self.reference_velocity(samples, idx, x, s)
        calls += v_ref is not None
        v_ema = None
        if self.ema is not None:
            with torch.no_grad(), self.ema.swapped(params):
                v_ema = self.velocity(policy, samples, idx, x, s)
            calls += 1
        v = self.velocity(policy, samples, idx, x, s)
        log_prob = awm_log_prob(v, target, s, self.weighting, self.power)
        if on_policy or samples.old_log_probs is None:
            old = log_prob.detach()
        else:
            old = samples.old_log_probs[idx, j]
        ratio = (log_prob - old).exp()
        adv = weights[idx]
        policy_loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - self.clip_range, 1 + self.clip_range)).mean()
        kl = torch.zeros((), device=v.device)
        if v_ref is not None:
            kl = (v.float() - v_ref.float()).pow(2).flatten(1).mean(1).mean()
        loss = policy_loss + self.kl_weight * kl
        if v_ema is not None:
            loss = loss + self.ema_weight * (v.float() - v_ema.float()).pow(2).flatten(1).mean(1).mean()
        clip_frac = ((ratio.detach() - 1).abs() > self.clip_range).float().mean()
        return loss, stats_of(loss, policy_loss, kl, ratio.detach(), clip_frac), calls

    def after_rollout(self, params: Sequence[nn.Parameter], optimizer_steps: int) -> None:
        if self.ema is not None:
            self.ema.update(params, soft_update_rate(optimizer_steps, 0, self.ema_rate, self.ema_cap))

    def state_dict(self) -> dict:
        return {} if self.ema is None else {"ema": self.ema.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
