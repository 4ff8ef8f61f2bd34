"""`jagg_cv`: JAGG made unbiased by a control variate (docs/method.md section 8, ours).

Plain JAGG's window estimate H = sum_k Jhat_k^T g_k, with Jhat_k = (1 - alpha_k) J_a + alpha_k J_b,
is biased: g_k carries the noise injected at step k and J_b(x_b) depends on it, so the
score-function identity that makes E[A J_k^T score_k] vanish for a constant advantage breaks.
Draw one interior step r of the window with probability q_r and add

    (1 / q_r) (J_r^T g_r - Jhat_r^T g_r)

Its mean over r is exactly the window's full gradient sum_k J_k^T g_k, whatever the model.
All three Jacobian products go through ONE joint forward and backward over [x_a; x_r; x_b]:
3 backward items per window instead of W. Correcting a window only with probability
`correct_prob` p (weight 1 / (p q_r)) keeps it unbiased at 2 + p expected items per window.

`n_correct` k > 1 corrects k of the window's m interior steps, drawn uniformly without
replacement, each with weight m / (k p) (each step is in the draw with probability k / m): 2 + k
items per corrected window (all interior steps when k >= m, the window's exact gradient at
p = 1), and a smaller weight per corrected step than the single step's m / p.

proposal: "uniform" (q_r = 1/m for m interior steps) or "bend" (q_r proportional to how far the
rollout's cached v_r lies off the chord between the endpoints, plus a floor so that every step
keeps a chance: correct where the interpolation errs most).
"""
from __future__ import annotations

from typing import Sequence

import torch

from jagg_lab.strategies.base import WindowedStrategy
from jagg_lab.strategies.core import (
    BackwardStats,
    Segment,
    StepLossFn,
    VelocityFn,
    check_mode,
    check_pass_items,
    effective_mode,
    interpolate_backward,
    check_weights,
    interpolation_weights,
    partition_windows,
)

__all__ = ["PROPOSALS", "interior_probabilities", "jagg_cv_backward", "JaggCVStrategy"]

PROPOSALS = ("uniform", "bend")
# share of the "bend" proposal spread uniformly, so that no interior step has probability 0
BEND_FLOOR = 0.2


def check_draws(correct_prob: float, proposal: str, n_correct: int = 1) -> None:
    if not 0 < correct_prob <= 1:
        raise ValueError(f"strategy.correct_prob must be in (0, 1], got {correct_prob}")
    if proposal not in PROPOSALS:
        raise ValueError(f"strategy.proposal must be one of {PROPOSALS}, got {proposal!r}")
    if n_correct < 1:
        raise ValueError(f"strategy.n_correct must be >= 1, got {n_correct}")
    if n_correct > 1 and proposal != "uniform":
        raise ValueError(f"strategy.n_correct = {n_correct} draws its steps uniformly: set strategy.proposal=uniform")


def given_steps(choice, w: int, m: int, k: int) -> tuple[int, ...] | None:
    """`interior[w]` as the tuple of the window's corrected interior indices (None: no correction)."""
    if choice is None:
        return None
    chosen = (choice,) if isinstance(choice, int) else tuple(choice)
    if len(chosen) != k or len(set(chosen)) != k or not all(0 <= c < m for c in chosen):
        raise ValueError(f"interior[{w}] = {choice} is not {k} distinct of the window's {m} interior steps")
    return chosen


def interior_probabilities(
    steps: Sequence[int],
    noise_levels: Sequence[float],
    velocities: Sequence[torch.Tensor] | None,
    proposal: str = "uniform",
    weights: str = "noise",
) -> torch.Tensor:
    """q_r over the interior steps of one window (steps[1:-1]), (m,) float64, summing to 1."""
    m = len(steps) - 2
    uniform = torch.full((m,), 1.0 / m, dtype=torch.float64)
    if proposal == "uniform":
        return uniform
    if velocities is None:
        raise ValueError("proposal='bend' reads the rollout's cached velocities; pass velocities=")
    alphas = interpolation_weights([float(noise_levels[k]) for k in steps], by=weights)[1:-1]
    v_a, v_b = velocities[steps[0]].double(), velocities[steps[-1]].double()
    bend = torch.stack([
        (velocities[k].double() - ((1 - alpha) * v_a + alpha * v_b)).pow(2).sum()
        for k, alpha in zip(steps[1:-1], alphas)
    ]).cpu()
    if not bend.sum() > 0:
        return uniform
    return (1 - BEND_FLOOR) * bend / bend.sum() + BEND_FLOOR * uniform


def jagg_cv_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    *,
    window: int = 4,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "cached",
    correct_prob: float = 1.0,
    generator: torch.Generator | None = None,
    interior: Sequence[int | Sequence[int] | None] | None = None,
    proposal: str = "uniform",
    max_pass_items: int | None = None,
    n_correct: int = 1,
    weights: str = "noise",
) -> dict[str, float]:
    """Accumulate the control-variate JAGG estimate of grad sum_k L_k into .grad.

    Arguments as `jagg_backward`, plus: correct_prob p in (0, 1]: each window with interior
    steps is corrected with probability p. generator: drives the draws (seeded by the
    caller for reproducibility). interior: per window, the index (0-based, among that
    window's interior steps) of the step to correct (with n_correct > 1: min(n_correct, m)
    distinct indices), or None for no correction, instead of the draws. proposal: how r is
    drawn (see PROPOSALS). max_pass_items: as `jagg_backward`. n_correct: interior steps
    corrected per corrected window (see the module docstring). weights: as `jagg_backward`.
    Returns stats as `jagg_backward`, plus `corrected_windows`.
    """
    if len(states) != len(noise_levels):
        raise ValueError(f"got {len(states)} states but {len(noise_levels)} noise levels")
    check_mode(mode, velocities)
    check_draws(correct_prob, proposal, n_correct)
    windows = partition_windows(len(states), window)
    if interior is not None and len(interior) != len(windows):
        raise ValueError(f"interior names {len(interior)} windows, but there are {len(windows)}")
    stats = BackwardStats()
    corrected = 0
    for w, steps in enumerate(windows):
        m = len(steps) - 2
        segment = Segment(steps[0], steps[-1])
        if m >= 1:
            k = min(n_correct, m)
            q = None  # the proposal, computed only for a window that is corrected
            if interior is not None:
                chosen = given_steps(interior[w], w, m, k)
            elif torch.rand((), generator=generator).item() < correct_prob:
                if k == 1:
                    q = interior_probabilities(steps, noise_levels, velocities, proposal, weights)
                    chosen = (int(torch.multinomial(q.float(), 1, generator=generator)),)
                else:
                    chosen = tuple(sorted(torch.randperm(m, generator=generator)[:k].tolist()))
            else:
                chosen = None
            if chosen is not None:
                if k == 1:
                    q = interior_probabilities(steps, noise_levels, velocities, proposal, weights) if q is None else q
                    scales = [1.0 / (correct_prob * q[chosen[0]].item())]
                else:
                    scales = [m / (k * correct_prob)] * k
                corrected += 1
                segment = Segment(steps[0], steps[-1], corrections=tuple((steps[1 + c], wt) for c, wt in zip(chosen, scales)))
        stats.add(interpolate_backward(velocity_fn, states, noise_levels, step_loss_fn, [segment], velocities=velocities,
                                       mode=mode, max_pass_items=max_pass_items, weights=weights))
    out = stats.as_dict()
    out["corrected_windows"] = corrected
    return out


class JaggCVStrategy(WindowedStrategy):
    """window, mode: as `jagg`. correct_prob: share of windows corrected (expected backward
    items 2 + correct_prob * min(n_correct, m) per window of m >= 1 interior steps).
    proposal: uniform | bend. n_correct: interior steps corrected per corrected window.
    seed: the draws' generator, whose state checkpoints carry for an exact resume.
    max_pass_items: batches of B rows per joint pass (1: no more than `full`'s; null: all).
    weights: the interpolation weights by "noise" level or by step "index", as `jagg`."""

    def __init__(self, window: int = 4, mode: str = "cached", correct_prob: float = 1.0, proposal: str = "uniform",
                 seed: int = 0, max_pass_items: int | None = None, diagnose_every: int = 0, n_correct: int = 1,
                 weights: str = "noise"):
        super().__init__(window=window, diagnose_every=diagnose_every, seed=seed)
        check_mode(mode)
        check_weights(weights)
        self.weights = weights
        check_pass_items(max_pass_items)
        check_draws(correct_prob, proposal, n_correct)
        self.max_pass_items = max_pass_items
        self.mode, self.correct_prob, self.proposal, self.n_correct = mode, correct_prob, proposal, n_correct

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        mode, fallbacks = effective_mode(self.mode, on_policy)
        stats = jagg_cv_backward(
            velocity_fn, states, noise_levels, step_loss_fn, window=self.window, velocities=velocities, mode=mode,
            correct_prob=self.correct_prob, generator=self.generator, proposal=self.proposal,
            max_pass_items=self.max_pass_items, n_correct=self.n_correct, weights=self.weights,
        )
        stats["fallbacks"] = fallbacks
        return stats
