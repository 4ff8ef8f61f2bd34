"""Pure SDE / ODE steps for rectified flow, with Gaussian log-probabilities.

The SDE is Flow-GRPO's: the reverse-time SDE whose marginals match the ODE, with
noise scale `a` (``noise_level``). Every function here is pure so GRPO can
re-evaluate any step k, in any order, under any parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["SDEStep", "sde_std", "sde_mean", "sde_step", "gaussian_log_prob", "kl_penalty", "transition_kl", "ode_step"]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class SDEStep:
    sample: torch.Tensor  # (B, *X) x_{k+1}
    mean: torch.Tensor  # (B, *X) mu_k
    std: torch.Tensor  # () transition std, std_k * sqrt(-dt)
    log_prob: torch.Tensor  # (B,) log pi(x_{k+1} | x_k)


def sde_std(s: float, s_next: float, noise_level: float, s_first_below_one: float) -> tuple[float, float]:
    """Return (std_k, transition std = std_k * sqrt(-dt)).

    std_k = a * sqrt(s / (1 - s)) diverges at s = 1, so there the denominator uses the
    first noise level below one (Flow-GRPO's convention).
    """
    denom = 1.0 - (s_first_below_one if s >= 1.0 else s)
    std_k = noise_level * math.sqrt(s / denom)
    return std_k, std_k * math.sqrt(s - s_next)


def sde_mean(x: torch.Tensor, v: torch.Tensor, s: float, s_next: float, std_k: float) -> torch.Tensor:
    """mu_k = x + [v + std_k^2 / (2 s) (x + (1 - s) v)] dt with dt = s_next - s < 0."""
    dt = s_next - s
    return x + (v + std_k**2 / (2 * s) * (x + (1 - s) * v)) * dt


def transition_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: float) -> torch.Tensor:
    """KL between N(mean, std^2 I) and N(ref_mean, std^2 I) per dimension, one value per sample (B,).
    With the transition std = std_k sqrt(-dt) this is the exact KL of one SDE step."""
    return (mean - ref_mean).pow(2).flatten(1).mean(1) / (2 * std**2)


def kl_penalty(mean: torch.Tensor, ref_mean: torch.Tensor, std_k: float) -> torch.Tensor:
    """The GRPO loss's KL term of one step, per sample (B,): mean over dimensions of
    (mean - ref_mean)^2 / (2 std_k^2), Flow-GRPO's `kl_loss` (it divides by std_k^2, not by the
    transition variance std_k^2 (-dt)), so its published betas mean the same here. It equals
    (-dt) x `transition_kl` with std = std_k sqrt(-dt): the exact KL weighted by the step size."""
    return transition_kl(mean, ref_mean, std_k)


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: float, reduction: str = "mean") -> torch.Tensor:
    """Isotropic Gaussian log-density, reduced over all non-batch dims by `mean` or `sum`. (B,)"""
    per_dim = -((sample - mean) ** 2) / (2 * std**2) - math.log(std) - _LOG_SQRT_2PI
    per_dim = per_dim.flatten(1)
    if reduction == "mean":
        return per_dim.mean(1)
    if reduction == "sum":
        return per_dim.sum(1)
    raise ValueError(f"log_prob_reduction must be 'mean' or 'sum', got {reduction!r}")


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    s: float,
    s_next: float,
    *,
    noise_level: float,
    s_first_below_one: float,
    noise: torch.Tensor | None = None,
    sample: torch.Tensor | None = None,
    reduction: str = "mean",
) -> SDEStep:
    """One SDE step from noise level s to s_next.

    Pass `noise` to draw x_{k+1}, or `sample` to score a given x_{k+1} (GRPO's re-evaluation).
    """
    if (noise is None) == (sample is None):
        raise ValueError("pass exactly one of noise= or sample=")
    std_k, std = sde_std(s, s_next, noise_level, s_first_below_one)
    mean = sde_mean(x, v, s, s_next, std_k)
    if sample is None:
        sample = mean + std * noise
    log_prob = gaussian_log_prob(sample, mean, std, reduction)
    return SDEStep(sample=sample, mean=mean, std=torch.tensor(std), log_prob=log_prob)


def ode_step(x: torch.Tensor, v: torch.Tensor, s: float, s_next: float) -> torch.Tensor:
    """Euler step of dx/ds = v."""
    return x + v * (s_next - s)
