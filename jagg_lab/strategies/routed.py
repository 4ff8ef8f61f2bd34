"""`jagg_routed`: deploy JAGG only on windows where the velocity moves along a line (docs/method.md section 5).

Score of a window, per sample, from the rollout's cached velocities (free):
min over intermediate k of cos(v_k - v_a, v_b - v_a); 1.0 for windows of <= 2 steps.
Routing is decided per window for the whole micro-batch (the samples' scores are
aggregated), so each window costs either one joint backward (JAGG) or W (full).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from jagg_lab.strategies.core import BackwardStats, effective_mode, full_step_backward
from jagg_lab.strategies.jagg import JaggStrategy, jagg_window_backward

__all__ = ["window_scores", "check_routing", "route_windows", "JaggRoutedStrategy", "NOISE_REGIONS"]

# Noise-level regions for routing statistics: a window belongs to the region of its mean level.
NOISE_REGIONS = (("high", 2 / 3, math.inf), ("mid", 1 / 3, 2 / 3), ("low", -math.inf, 1 / 3))


def window_scores(velocities: Sequence[torch.Tensor], steps: Sequence[int]) -> torch.Tensor:
    """Per-sample linearity score of one window, (B,). velocities: K tensors (B, *X)."""
    v_a = velocities[steps[0]].flatten(1)
    if len(steps) <= 2:
        return torch.ones(v_a.shape[0], device=v_a.device)
    chord = velocities[steps[-1]].flatten(1) - v_a
    cosines = [
        torch.nn.functional.cosine_similarity(velocities[k].flatten(1) - v_a, chord, dim=1, eps=1e-12)
        for k in steps[1:-1]
    ]
    return torch.stack(cosines, 1).min(1).values


def check_routing(cos_threshold: float | None, jagg_frac: float | None) -> None:
    """Exactly one routing rule, inside its range."""
    if (cos_threshold is None) == (jagg_frac is None):
        raise ValueError("set exactly one of strategy.cos_threshold and strategy.jagg_frac")
    if cos_threshold is not None and not -1 <= cos_threshold <= 1:
        raise ValueError(f"strategy.cos_threshold must be in [-1, 1], got {cos_threshold}")
    if jagg_frac is not None and not 0 <= jagg_frac <= 1:
        raise ValueError(f"strategy.jagg_frac must be in [0, 1], got {jagg_frac}")


def route_windows(scores: Sequence[float], *, cos_threshold: float | None, jagg_frac: float | None) -> list[bool]:
    """Which windows go through JAGG: score >= threshold, or the top `jagg_frac` share by score."""
    check_routing(cos_threshold, jagg_frac)
    if cos_threshold is not None:
        return [score >= cos_threshold for score in scores]
    n_jagg = round(jagg_frac * len(scores))
    # Stable order: ties go to the earlier (higher-noise) window.
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen = set(order[:n_jagg])
    return [i in chosen for i in range(len(scores))]


class JaggRoutedStrategy(JaggStrategy):
    """Threshold mode (cos_threshold) or target mode (jagg_frac); set exactly one.

    aggregate: how per-sample scores make the micro-batch's window score ("mean" or "min").
    Only windows of 3 or more steps are routed (on shorter ones JAGG is exact and saves no
    backward item; they always take the joint pass). Logs the realised `jagg_frac` (the share
    of those windows that went through JAGG), `backward_items_saved` against `full`, and, per
    noise region, the mean score and routed share.
    """

    def __init__(
        self,
        window: int = 4,
        mode: str = "cached",
        cos_threshold: float | None = None,
        jagg_frac: float | None = None,
        aggregate: str = "mean",
        max_pass_items: int | None = None,
        diagnose_every: int = 0,
    ):
        super().__init__(window=window, mode=mode, max_pass_items=max_pass_items, diagnose_every=diagnose_every)
        check_routing(cos_threshold, jagg_frac)
        if aggregate not in ("mean", "min"):
            raise ValueError(f"strategy.aggregate must be 'mean' or 'min', got {aggregate!r}")
        self.cos_threshold = cos_threshold
        self.jagg_frac = jagg_frac
        self.aggregate = aggregate

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        if velocities is None:
            raise ValueError("jagg_routed scores windows from the rollout's cached velocities; pass velocities=")
        mode, fallbacks = effective_mode(self.mode, on_policy)
        windows = self.windows(len(states))
        # Only windows of 3 or more steps are a choice: on shorter ones JAGG is exact and saves nothing.
        choices = [i for i, steps in enumerate(windows) if len(steps) >= 3]
        per_sample = [window_scores(velocities, windows[i]) for i in choices]
        scores = [(s.mean() if self.aggregate == "mean" else s.min()).item() for s in per_sample]
        routed = set(i for i, use in zip(choices, route_windows(scores, cos_threshold=self.cos_threshold,
                                                                jagg_frac=self.jagg_frac)) if use)
        stats = BackwardStats()
        for i, steps in enumerate(windows):
            if i in routed or i not in choices:
                stats.add(jagg_window_backward(velocity_fn, states, noise_levels, step_loss_fn, steps, velocities=velocities,
                                               mode=mode, max_pass_items=self.max_pass_items))
            else:
                stats.windows += 1
                for k in steps:
                    stats.add(full_step_backward(velocity_fn, states[k], float(noise_levels[k]), k, step_loss_fn))
        stats.jagg_windows = len(routed)
        out = stats.as_dict()
        out["fallbacks"] = fallbacks if routed else 0
        out["jagg_frac"] = len(routed) / len(choices) if choices else 0.0
        out["backward_items_saved"] = len(states) - stats.backward_items
        for name, lo, hi in NOISE_REGIONS:
            members = [j for j, i in enumerate(choices)
                       if lo <= sum(float(noise_levels[k]) for k in windows[i]) / len(windows[i]) < hi]
            if members:
                out[f"route_score_{name}"] = sum(scores[j] for j in members) / len(members)
                out[f"jagg_frac_{name}"] = sum(choices[j] in routed for j in members) / len(members)
        return out
