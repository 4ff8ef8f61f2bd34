"""Bias and added variance of a gradient estimator against the exact (`full`) gradient.

In GRPO one rollout's gradient is roughly ten times larger than its mean over rollouts, so
a per-rollout cosine to `full` is no fidelity measure: what matters is whether an
estimator's error d = g - f averages out over independent rollouts (bias) and how large it
is against the noise f carries anyway (added variance). Sums run over rollouts, so memory
does not grow with their number.
"""
from __future__ import annotations

import math

import torch

__all__ = ["ErrorSums", "bias_summary"]


class ErrorSums:
    """Running sums over rollouts of an estimator g against the reference f (vectors of P)."""

    def __init__(self):
        self.n = 0
        self.sum_d = self.sum_f = self.sum_g = self.sum_d_odd = self.sum_d2 = self.sum_d4 = None
        self.sq_d = self.sq_f = self.cos = self.worst_sq_d = self.coord_kurtosis = 0.0
        self.erring = 0  # rollouts with a nonzero error

    def add(self, g: torch.Tensor, f: torch.Tensor) -> None:
        g, f = g.double(), f.double()
        d = g - f
        if self.sum_d is None:
            self.sum_d, self.sum_f, self.sum_g, self.sum_d_odd, self.sum_d2, self.sum_d4 = (torch.zeros_like(d) for _ in range(6))
        self.sum_d += d
        self.sum_f += f
        self.sum_g += g
        if self.n % 2:
            self.sum_d_odd += d
        self.sum_d2 += d.square()
        self.sum_d4 += d.square().square()
        sq_d = d.square().sum().item()
        self.sq_d += sq_d
        self.worst_sq_d = max(self.worst_sq_d, sq_d)
        if sq_d > 0:
            self.coord_kurtosis += d.numel() * d.square().square().sum().item() / sq_d**2
            self.erring += 1
        self.sq_f += f.square().sum().item()
        self.cos += torch.nn.functional.cosine_similarity(g, f, dim=0).item()
        self.n += 1


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item()


def bias_summary(sums: ErrorSums) -> dict[str, float]:
    """The columns of the bias table, from the running sums of N >= 4 rollouts.

    z = |mean d|^2 / (tr Cov(d) / N): about 1 without bias (its expectation is exactly 1 when
    E d = 0), growing linearly in N with one. halves_cosine: cos(mean d over odd rollouts,
    over even ones), about 0 without bias. rel_error: rms per-rollout |d| over the rms
    per-rollout deviation of f from its mean (the noise a rollout's gradient carries anyway).
    How heavy-tailed the error is over rollouts, since Adam's per-coordinate scaling may amplify
    a concentrated one: worst_over_mean, the largest per-rollout |d|^2 over the mean |d|^2 (1
    when every rollout errs alike); rollout_kurtosis, the per-coordinate kurtosis of d over
    rollouts, E d^4 / (E d^2)^2 (3 for a Gaussian error; at most N), averaged over coordinates
    weighted by their share of the error; coord_kurtosis, the kurtosis of one rollout's d over
    the P coordinates, P sum d^4 / (sum d^2)^2, averaged over the rollouts with an error (large
    when the error sits on few parameters).
    """
    n = sums.n
    mean_d, mean_f, mean_g = sums.sum_d / n, sums.sum_f / n, sums.sum_g / n
    trace_cov_d = (sums.sq_d - n * mean_d.square().sum().item()) / (n - 1)
    trace_cov_f = (sums.sq_f - n * mean_f.square().sum().item()) / (n - 1)
    odd = sums.sum_d_odd / (n // 2)
    even = (sums.sum_d - sums.sum_d_odd) / (n - n // 2)
    return {
        "rollouts": n,
        "per_rollout_cosine": sums.cos / n,
        "z": _ratio(mean_d.square().sum().item(), trace_cov_d / n),
        "halves_cosine": _cos(odd, even),
        "bias_over_mean_full": _ratio(mean_d.norm().item(), mean_f.norm().item()),
        "mean_cosine": _cos(mean_g, mean_f),
        "rel_error": _ratio(math.sqrt(sums.sq_d / n), math.sqrt(max(trace_cov_f, 0.0) * (n - 1) / n)),
        "z_full": _ratio(mean_f.square().sum().item(), trace_cov_f / n),
        "worst_over_mean": _ratio(sums.worst_sq_d, sums.sq_d / n),
        "rollout_kurtosis": _rollout_kurtosis(sums),
        "coord_kurtosis": _ratio(sums.coord_kurtosis, sums.erring),
    }


def _rollout_kurtosis(sums: ErrorSums) -> float:
    """sum_j w_j k_j with k_j = n S4_j / S2_j^2 and w_j = S2_j / sum S2: n sum_j (S4_j / S2_j) / sum S2."""
    s2, s4 = sums.sum_d2, sums.sum_d4
    err = s2 > 0
    return _ratio(sums.n * (s4[err] / s2[err]).sum().item(), s2.sum().item())
