"""The shared core of every gradient strategy.

All strategies compute (an estimate of) grad_theta sum_k L_k(v_theta(x_k, s_k)) and
accumulate it into `.grad` (adding, never zeroing). They differ only in how the cheap
upstream signals g_k = dL_k/dv_k are pushed back through the expensive velocity model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

__all__ = [
    "flat_grad",
    "StepLossFn",
    "VelocityFn",
    "BackwardStats",
    "upstream_signal",
    "partition_windows",
    "interpolation_weights",
    "WEIGHTS",
    "check_weights",
    "full_step_backward",
    "full_backward",
    "noise_level_batch",
    "MODES",
    "check_mode",
    "effective_mode",
    "Segment",
    "interpolate_backward",
    "Route",
    "route_backward",
    "check_pass_items",
    "COUNTS",
    "combine_stats",
]

# Where a windowed strategy gets the velocities of steps it does not backpropagate through.
MODES = ("recompute", "cached", "interpolated")

# velocity_fn(x (B, *X), s (B,)) -> v (B, *X); gradients flow to the model's parameters.
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# step_loss_fn(k, v) -> scalar loss of trained step k as a differentiable function of v.
StepLossFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass
class BackwardStats:
    """Work done by one strategy call. A 'backward pass' is one backward through the model;
    'backward items' counts the batches of B samples it carried (JAGG's joint pass carries 2)."""

    backward_passes: int = 0
    backward_items: int = 0
    grad_forwards: int = 0
    nograd_forwards: int = 0
    windows: int = 0
    jagg_windows: int = 0
    fallbacks: int = 0
    loss: float = 0.0

    def add(self, other: "BackwardStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# Stats that count work or windows: summed over micro-batches; every other stat (shares,
# cosines, scores, positions) is averaged over the calls that report it.
COUNTS = frozenset(BackwardStats.__dataclass_fields__) | {"corrected_windows", "backward_items_saved"}


def combine_stats(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The stats of several strategy calls (an optimizer step's micro-batches) as one."""
    totals: dict[str, float] = {}
    reports: dict[str, int] = {}
    for stats in parts:
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value
            reports[key] = reports.get(key, 0) + 1
    return {key: value if key in COUNTS else value / reports[key] for key, value in totals.items()}


def noise_level_batch(s: float, like: torch.Tensor) -> torch.Tensor:
    """A (B,) tensor of noise level s matching the batch, device and dtype of `like`."""
    return torch.full((like.shape[0],), s, device=like.device, dtype=like.dtype)


def upstream_signal(step_loss_fn: StepLossFn, k: int, v: torch.Tensor) -> tuple[torch.Tensor, float]:
    """g_k = dL_k/dv_k at v (autograd on the tiny loss graph, v as a leaf) and the loss value."""
    v = v.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = step_loss_fn(k, v)
        (g,) = torch.autograd.grad(loss, v, allow_unused=True)
    return (torch.zeros_like(v) if g is None else g), loss.item()


def flat_grad(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parameters' accumulated gradients as one vector (zeros where there is none)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])


def partition_windows(num_steps: int, window: int) -> list[list[int]]:
    """Consecutive windows of `window` steps; a leftover shorter window closes the list."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [list(range(a, min(a + window, num_steps))) for a in range(0, num_steps, window)]


# How a window's interpolation weights are placed: by noise level (ours) or by step index (the
# JAGG authors' code: alpha_j = j / (W - 1)); the two coincide on a uniform noise grid.
WEIGHTS = ("noise", "index")


def check_weights(weights: str) -> None:
    if weights not in WEIGHTS:
        raise ValueError(f"strategy.weights must be one of {WEIGHTS}, got {weights!r}")


def interpolation_weights(noise_levels: Sequence[float], by: str = "noise") -> list[float]:
    """alpha_k for the steps of one window: (s_k - s_a) / (s_b - s_a) by noise level, or
    j / (len - 1) by position j in the window (by="index")."""
    check_weights(by)
    s_a, s_b = noise_levels[0], noise_levels[-1]
    if len(noise_levels) == 1:
        return [0.0]
    if by == "index":
        return [j / (len(noise_levels) - 1) for j in range(len(noise_levels))]
    if s_a == s_b:
        raise ValueError("a window's endpoints must have distinct noise levels")
    return [(s - s_a) / (s_b - s_a) for s in noise_levels]


def full_step_backward(
    velocity_fn: VelocityFn, state: torch.Tensor, s: float, k: int, step_loss_fn: StepLossFn, scale: float = 1.0
) -> BackwardStats:
    """Exact gradient of one step: a forward with grad and one backward through the model."""
    v = velocity_fn(state, noise_level_batch(s, state))
    loss = step_loss_fn(k, v)
    (loss * scale).backward()
    return BackwardStats(backward_passes=1, backward_items=1, grad_forwards=1, loss=loss.item())


_NOT_GIVEN = object()


def check_mode(mode: str, velocities=_NOT_GIVEN) -> None:
    """`mode` must be one of MODES; the modes other than `recompute` read the rollout's
    velocities, so a call that passes `velocities` must pass them for those."""
    if mode not in MODES:
        raise ValueError(f"strategy.mode must be one of {MODES}, got {mode!r}")
    if velocities is None and mode != "recompute":
        raise ValueError(f"mode={mode!r} needs the rollout's cached velocities (velocities=...)")


def effective_mode(mode: str, on_policy: bool) -> tuple[str, int]:
    """`cached` is exact only with the parameters that sampled the rollout; after that it
    falls back to `recompute`. Returns (mode to use, number of fallbacks to count)."""
    if mode == "cached" and not on_policy:
        return "recompute", 1
    return mode, 0


def full_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
) -> dict[str, float]:
    """Accumulate the exact gradient of sum_k L_k into .grad: K forwards with grad, K backwards."""
    stats = BackwardStats()
    for k, (state, s) in enumerate(zip(states, noise_levels)):
        stats.add(full_step_backward(velocity_fn, state, float(s), k, step_loss_fn))
    return stats.as_dict()


# ---- the interpolating core: one joint pass per piece of linked segments -------------------------
@dataclass(frozen=True)
class Segment:
    """Steps left..right (trained-step indices) whose Jacobian is interpolated between the knots
    `left` and `right` (left == right: a lone step, its exact gradient). `corrections`: pairs
    (r, weight) of interior steps whose exact Jacobian product also enters against their
    interpolated one, weight * (J_r - Jhat_r)^T g_r (the control variate of `jagg_cv`); none for
    plain JAGG."""

    left: int
    right: int
    corrections: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.right < self.left:
            raise ValueError(f"segment [{self.left}..{self.right}] runs backwards")
        steps = [r for r, _ in self.corrections]
        for r in steps:
            if not self.left < r < self.right:
                raise ValueError(f"corrected step {r} is not interior to [{self.left}..{self.right}]")
        if len(set(steps)) != len(steps):
            raise ValueError(f"corrected steps {steps} repeat a step")

    @property
    def interior(self) -> range:
        return range(self.left + 1, self.right)


def check_pass_items(max_pass_items: int | None) -> None:
    """The bound on one joint pass: null (a window's or all knots' nodes together) or >= 1."""
    if max_pass_items is not None and max_pass_items < 1:
        raise ValueError(f"strategy.max_pass_items must be >= 1 or null, got {max_pass_items}")


def interpolate_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    segments: Sequence[Segment],
    *,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "recompute",
    max_pass_items: int | None = None,
    weights: str = "noise",
) -> BackwardStats:
    """One piece of the interpolating strategies: the Jacobian is interpolated linearly in
    noise level (weights="noise"; "index": by position in the segment) inside each segment, so every step's upstream signal g_k reaches the model
    through the segments' knots (plus corrected steps): sum over nodes n of J_n^T G_n. The
    nodes go through one joint forward with grad and ONE backward of sum <v_n, G_n>, split
    into passes of at most `max_pass_items` nodes (batches of B rows) when memory demands:
    1 keeps every pass at the rows `full` uses.

    Consecutive segments may share a knot (`jagg_knots`); a knot's own g goes wholly to it.
    The velocities of other steps come by `mode` (see MODES); a corrected step's g too, so the
    correction needs no velocity from a later pass. Accumulates into .grad.
    """
    levels = [float(s) for s in noise_levels]
    routes = {k: Route(k, ((k, 1.0),)) for seg in segments for k in (seg.left, seg.right)}
    spans = [seg for seg in segments if seg.right > seg.left]
    for seg in spans:
        alphas = interpolation_weights(levels[seg.left : seg.right + 1], by=weights)
        corrections = dict(seg.corrections)
        for k, alpha in zip(seg.interior, alphas[1:-1]):
            routes[k] = Route(k, ((seg.left, 1 - alpha), (seg.right, alpha)), corrections.get(k, 0.0))
    stats = route_backward(velocity_fn, states, levels, step_loss_fn, list(routes.values()), velocities=velocities,
                           mode=mode, max_pass_items=max_pass_items)
    stats.windows = stats.jagg_windows = len(spans)
    return stats


@dataclass(frozen=True)
class Route:
    """How trained step `step`'s upstream signal g_k reaches the model: through the Jacobians of
    `nodes`, pairs (node step n, weight w_n) with Jhat_k = sum_n w_n J_n(x_n) (weights summing
    to 1, or any affine combination), plus `correction` c: c * (J_k - Jhat_k)^T g_k, the exact
    Jacobian product of the step itself entering against its estimate (the control variate of
    `jagg_cv`). A step routed wholly to itself, ((k, 1.0),), is a node with its exact gradient."""

    step: int
    nodes: tuple[tuple[int, float], ...]
    correction: float = 0.0

    @property
    def exact(self) -> bool:
        return self.nodes == ((self.step, 1.0),) and not self.correction


def route_backward(
    velocity_fn: VelocityFn,
    states: Sequence[torch.Tensor],
    noise_levels: Sequence[float],
    step_loss_fn: StepLossFn,
    routes: Sequence[Route],
    *,
    velocities: Sequence[torch.Tensor] | None = None,
    mode: str = "recompute",
    max_pass_items: int | None = None,
) -> BackwardStats:
    """The pass loop every Jacobian-sharing strategy runs: each routed step's g_k is pushed onto
    its nodes with its route's weights, and the nodes go through one joint forward with grad
    and ONE backward of sum <v_n, G_n>, split into passes of at most `max_pass_items` nodes.
    An exact step (a node routed to itself) takes its g from the pass's own forward; every other
    step's velocity comes by `mode` (the interpolated mode carries the nodes' parameter change
    over with the route's weights). Accumulates into .grad; `windows` is left to the caller."""
    levels = [float(s) for s in noise_levels]
    nodes = sorted({n for route in routes for n, _ in route.nodes} | {r.step for r in routes if r.correction})
    exact = {route.step for route in routes if route.exact}
    missing = sorted(set(nodes) - exact - {r.step for r in routes if r.correction})
    if missing:
        raise ValueError(f"nodes {missing} are not routed to themselves: a node's own step is exact")
    check_pass_items(max_pass_items)
    chunk = len(nodes) if max_pass_items is None else max_pass_items
    passes = [nodes[i : i + chunk] for i in range(0, len(nodes), chunk)]
    stats = BackwardStats(backward_passes=len(passes), backward_items=len(nodes))
    batch = states[0].shape[0]

    def forward(steps: list[int]) -> torch.Tensor:
        return velocity_fn(torch.cat([states[k] for k in steps]), torch.cat([noise_level_batch(levels[k], states[k]) for k in steps]))

    def split(v: torch.Tensor, steps: list[int]) -> dict[int, torch.Tensor]:
        return {k: v[i * batch : (i + 1) * batch] for i, k in enumerate(steps)}

    # The nodes' current velocities: from the joint forward with grad when it is one pass; the
    # interpolated mode needs them for every route up front, hence no-grad passes when split.
    outputs: dict[int, torch.Tensor] = {}
    current: dict[int, torch.Tensor] = {}
    if len(passes) == 1:
        outputs = split(forward(passes[0]), passes[0])
        stats.grad_forwards += 1
        current = {k: v.detach() for k, v in outputs.items()}
    elif mode == "interpolated":
        with torch.no_grad():
            for steps in passes:
                current.update(split(forward(steps), steps))
        stats.nograd_forwards += len(passes)

    signal: dict[int, torch.Tensor] = {}

    def add(node: int, g: torch.Tensor) -> None:
        signal[node] = g if node not in signal else signal[node] + g

    for route in routes:
        if route.exact:
            continue
        k = route.step
        if mode == "recompute":
            with torch.no_grad():
                v_k = velocity_fn(states[k], noise_level_batch(levels[k], states[k]))
            stats.nograd_forwards += 1
        elif mode == "cached":
            v_k = velocities[k]
        else:  # interpolated: carry the nodes' parameter change over to step k
            v_k = velocities[k]
            for n, w in route.nodes:
                v_k = v_k + w * (current[n] - velocities[n])
        g_k, loss_k = upstream_signal(step_loss_fn, k, v_k)
        stats.loss += loss_k
        # The control variate moves c * g_k from the estimated Jacobian to the exact one.
        share = 1.0 - route.correction
        for n, w in route.nodes:
            add(n, (share * w) * g_k)
        if route.correction:
            add(k, route.correction * g_k)

    for steps in passes:
        if len(passes) > 1:
            outputs = split(forward(steps), steps)
            stats.grad_forwards += 1
        surrogate = 0.0
        for k in steps:
            if k in exact:
                g_k, loss_k = upstream_signal(step_loss_fn, k, outputs[k].detach())
                stats.loss += loss_k
                add(k, g_k)
            surrogate = surrogate + (outputs[k] * signal[k]).sum()
        surrogate.backward()
    return stats
