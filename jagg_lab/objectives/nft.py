"""DiffusionNFT, online diffusion reinforcement with the forward process (arXiv 2509.16117).

Rollouts are sampled by the *old* policy theta_old, a soft copy of the weights. Per sample x0 and
each of its K training states x_s = (1 - s) x0 + s eps, two implicit policies around it,

    v+ = beta v_theta + (1 - beta) v_old        (pulled toward the good samples)
    v- = (1 + beta) v_old - beta v_theta        (its mirror image, pushed toward the bad ones)

are trained with the flow-matching loss in x0 space, each normalised by its own (detached) error:

    x0+- = x_s - s v+-,   L+- = mean (x0+- - x0)^2 / stopgrad(mean |x0+- - x0|)
    loss = loss_scale mean (r L+ + (1 - r) L-) / beta + kl_weight mean ||v_theta - v_ref||^2

r = clamp(0.5 + A / (2 clip_max), 0, 1), the "optimality probability" from the group advantage A
(group mean, global std, clipped to +-clip_max). After each rollout's optimizer steps the old
policy moves: theta_old <- eta theta_old + (1 - eta) theta, eta = min(decay_cap, decay_rate *
(optimizer steps - decay_flat)) (0 during the first decay_flat steps). Training levels: per sample,
int(T * time_fraction) of the rollout grid's T levels, without repetition, in random order.
With all rewards equal (r = 1/2) the gradient at theta = theta_old is zero; as beta -> 0 it tends
to (2r - 1) times the gradient of the (normalised) flow-matching loss: a reward-weighted
flow matching, AWM's form. Published (SD3.5-M, GenEval): beta 1, 9 of 10 levels, loss_scale 5,
kl 1e-4, eta min(0.5, 0.001 step); rollouts CFG-free (guidance 1) by a 2nd-order solver.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from jagg_lab.grpo.loss import StepStats
from jagg_lab.objectives.forward import (
    ForwardObjective, Samples, SoftCopy, check_fraction, check_schedule, grid_levels, noised, soft_update_rate, stats_of,
)

__all__ = ["DiffusionNFT", "nft_loss"]


def _l1(x: torch.Tensor) -> torch.Tensor:
    return x.abs().flatten(1).mean(1)


def nft_loss(v: torch.Tensor, v_old: torch.Tensor, x: torch.Tensor, x0: torch.Tensor, s: torch.Tensor,
             r: torch.Tensor, beta: float) -> torch.Tensor:
    """DiffusionNFT's policy loss per sample (B,), before loss_scale: (r L+ + (1 - r) L-) / beta."""
    s = s.view(-1, *([1] * (x.dim() - 1))).float()
    v, v_old, x, x0 = v.float(), v_old.float(), x.float(), x0.float()
    v_pos = beta * v + (1 - beta) * v_old
    v_neg = (1 + beta) * v_old - beta * v
    err_pos, err_neg = x - s * v_pos - x0, x - s * v_neg - x0
    loss_pos = err_pos.pow(2).flatten(1).mean(1) / _l1(err_pos).detach().clamp_min(1e-5)
    loss_neg = err_neg.pow(2).flatten(1).mean(1) / _l1(err_neg).detach().clamp_min(1e-5)
    return (r * loss_pos + (1 - r) * loss_neg) / beta


class DiffusionNFT(ForwardObjective):
    """beta: the implicit policies' strength. time_fraction: share of the grid's levels each sample
    trains on. loss_scale: the published factor on the policy term (it sets its balance against
    kl_weight). decay_flat, decay_rate, decay_cap: the old policy's soft update. solver: the
    rollouts' ODE solver."""

    name = "nft"

    def __init__(self, beta: float = 1.0, time_fraction: float = 0.99, loss_scale: float = 5.0,
                 kl_weight: float = 1e-4, decay_flat: int = 0, decay_rate: float = 0.001, decay_cap: float = 0.5,
                 solver: str = "euler"):
        super().__init__(solver=solver, kl_weight=kl_weight)
        if beta <= 0:
            raise ValueError(f"objective.beta must be > 0, got {beta}")
        check_fraction(time_fraction, "objective.time_fraction")
        if loss_scale <= 0:
            raise ValueError(f"objective.loss_scale must be > 0, got {loss_scale}")
        check_schedule(decay_flat=decay_flat, decay_rate=decay_rate, decay_cap=decay_cap)
        self.beta, self.time_fraction, self.loss_scale = beta, time_fraction, loss_scale
        self.decay_flat, self.decay_rate, self.decay_cap = decay_flat, decay_rate, decay_cap
        self.old: SoftCopy | None = None


    def check_settings(self, cfg) -> list[str]:
        """The authors' code multiplies the policy loss by its advantage clip (`adv_clip_max`); here
        loss_scale is that factor, so a clip set apart from it would change the loss silently."""
        clip = cfg.get("grpo", {}).get("adv_clip_max", self.loss_scale)
        if clip != self.loss_scale:
            return [f"objective.loss_scale={self.loss_scale:g} and grpo.adv_clip_max={clip:g} differ: DiffusionNFT scales "
                    "its policy loss by its advantage clip; set both to the same value"]
        return []
    def attach(self, policy, params, guidance, ref_policy=None) -> None:
        super().attach(policy, params, guidance, ref_policy)
        self.old = SoftCopy(params)

    def sampling_weights(self, params):
        return self.old.swapped(params)

    def draw_levels(self, batch, noise_levels, generator) -> torch.Tensor:
        grid = grid_levels(noise_levels)
        k = max(1, int(len(grid) * self.time_fraction))
        order = torch.rand((batch, len(grid)), generator=generator).argsort(1)[:, :k]
        return grid[order].float()

    def sample_weights(self, advantages, clip_max) -> torch.Tensor:
        return (0.5 + advantages.clamp(-clip_max, clip_max) / (2 * clip_max)).clamp(0, 1)

    def state_loss(self, policy, params, samples: Samples, idx, j, weights, on_policy) -> tuple[torch.Tensor, StepStats, int]:
        x0, eps, s = samples.final[idx], samples.noise[idx, j], samples.levels[idx, j]
        x = noised(x0, eps, s)
        with torch.no_grad(), self.old.swapped(params):
            v_old = self.velocity(policy, samples, idx, x, s)
        calls = 1
        v_ref = self.reference_velocity(samples, idx, x, s)
        calls += v_ref is not None
        v = self.velocity(policy, samples, idx, x, s)
        policy_loss = self.loss_scale * nft_loss(v, v_old, x, x0, s, weights[idx], self.beta).mean()
        kl = torch.zeros((), device=v.device)
        if v_ref is not None:
            kl = (v.float() - v_ref.float()).pow(2).flatten(1).mean(1).mean()
        loss = policy_loss + self.kl_weight * kl
        return loss, stats_of(loss, policy_loss, kl), calls

    def after_rollout(self, params: Sequence[nn.Parameter], optimizer_steps: int) -> None:
        self.old.update(params, soft_update_rate(optimizer_steps, self.decay_flat, self.decay_rate, self.decay_cap))

    def state_dict(self) -> dict:
        return {"old": self.old.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.old.load_state_dict(state["old"])
