"""The per-step GRPO loss, written as a function of the velocity v_k.

L_k depends on the parameters only through v_k = v_theta(x_k, s_k, c), so a gradient
strategy can take g_k = dL_k / dv_k from this small graph and decide on its own how
to push it through the transformer (docs/method.md section 2).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jagg_lab.sampling.sde import gaussian_log_prob, kl_penalty, sde_mean, sde_std

__all__ = ["GRPOLoss", "StepStats"]


@dataclass(frozen=True)
class StepStats:
    """Statistics of one step's loss, as detached 0-d tensors (no device sync in the hot loop)."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor
    clip_frac: torch.Tensor
    approx_kl: torch.Tensor
    ratio_mean: torch.Tensor


@dataclass(frozen=True)
class GRPOLoss:
    """The clipped GRPO objective of one sampling step, plus beta * KL to the reference.

    clip_range: PPO epsilon. beta: KL weight (0 disables the reference policy entirely), on
    Flow-GRPO's scale (`kl_penalty`: divided by std_k^2, not the transition variance), so its
    published betas (0.04 GenEval / OCR, 0.01 PickScore) carry over.
    noise_level / log_prob_reduction must be those the rollout was sampled with.
    """

    clip_range: float = 1e-4
    beta: float = 0.0

    def __post_init__(self) -> None:
        if self.clip_range <= 0:
            raise ValueError(f"grpo.clip_range must be > 0, got {self.clip_range}")
        if self.beta < 0:
            raise ValueError(f"grpo.beta must be >= 0, got {self.beta}")

    def __call__(
        self,
        v: torch.Tensor,
        x: torch.Tensor,
        next_x: torch.Tensor,
        s: float,
        s_next: float,
        old_log_prob: torch.Tensor | None,
        advantages: torch.Tensor,
        *,
        noise_level: float,
        s_first_below_one: float,
        reduction: str = "mean",
        ref_mean: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, StepStats]:
        """Loss of step k averaged over the B samples. v, x, next_x, ref_mean: (B, *X); others (B,).

        old_log_prob None: the step is on-policy, and the behaviour log-prob is this forward's
        own, detached: the ratio is exactly 1 and its gradient that of the log-prob, whatever
        rounding separates the rollout's forward from this one (bfloat16 autocast, another
        batch composition). A clip range of 1e-4 would otherwise clip on rounding alone."""
        std_k, std = sde_std(s, s_next, noise_level, s_first_below_one)
        mean = sde_mean(x, v, s, s_next, std_k)
        log_prob = gaussian_log_prob(next_x, mean, std, reduction)
        log_ratio = log_prob - (log_prob.detach() if old_log_prob is None else old_log_prob)
        ratio = log_ratio.exp()
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1 - self.clip_range, 1 + self.clip_range)
        policy_loss = torch.maximum(unclipped, clipped).mean()
        loss = policy_loss
        kl = torch.zeros((), device=v.device)
        if self.beta > 0:
            if ref_mean is None:
                raise ValueError("grpo.beta > 0 needs the reference means cached at rollout time")
            # Flow-GRPO's KL term: per dimension, over std_k^2 (the exact transition KL times -dt).
            kl = kl_penalty(mean, ref_mean, std_k).mean()
            loss = loss + self.beta * kl
        with torch.no_grad():
            stats = StepStats(
                loss=loss.detach(),
                policy_loss=policy_loss.detach(),
                kl=kl.detach(),
                clip_frac=((ratio - 1).abs() > self.clip_range).float().mean(),
                approx_kl=(0.5 * log_ratio**2).mean(),
                ratio_mean=ratio.mean(),
            )
        return loss, stats
