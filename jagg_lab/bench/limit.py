"""How far a training step is from what the machine can do: FLOPs counted per phase, and the
matmul rate the machine reaches in each precision, on the model's own shapes and a large square.

`bench step limit=true` uses these: a phase's achieved rate is its counted FLOPs over its
measured seconds, and its share of the peak is that rate over the best matmul rate measured in
the precision the phase ran in. FLOPs are torch's own count (`torch.utils.flop_counter`: matrix
products, convolutions and attention; elementwise work counts nothing), so a phase far below the
peak spends its time in work the count leaves out, or in matmuls too small to reach the peak.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from jagg_lab.bench.common import cpu_bf16_flags, gradient_phase
from jagg_lab.bench.report import markdown_table
from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.rewards.base import check_scores

__all__ = ["count_flops", "LinearShape", "linear_shapes", "matmul_rate", "matmul_peaks", "SQUARE", "step_limit", "achieved",
           "limit_table"]

SQUARE = 4096  # the large square product every report measures beside the model's shapes
DTYPES = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16}
T = TypeVar("T")


def count_flops(fn: Callable[[], T]) -> tuple[int, T]:
    """The FLOPs torch counts while fn() runs (forward and backward alike), and what fn returned."""
    with FlopCounterMode(display=False) as counter:
        result = fn()
    return counter.get_total_flops(), result


@dataclass(frozen=True)
class LinearShape:
    """One linear layer's product as a call runs it: (rows x inputs) @ (inputs x outputs)."""

    rows: int
    inputs: int
    outputs: int

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.inputs * self.outputs

    def __str__(self) -> str:
        return f"{self.rows}x{self.inputs}x{self.outputs}"


def linear_shapes(model: nn.Module, call: Callable[[], object], top: int = 4) -> list[LinearShape]:
    """The `top` linear-layer products of `model` that carry the most FLOPs during call(), each
    once (the rows of a (B, N, D) input are B * N)."""
    seen: dict[LinearShape, int] = {}

    def hook(layer: nn.Linear, inputs: tuple[torch.Tensor, ...], _output) -> None:
        shape = LinearShape(inputs[0].numel() // layer.in_features, layer.in_features, layer.out_features)
        seen[shape] = seen.get(shape, 0) + shape.flops

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        call()
    finally:
        for handle in handles:
            handle.remove()
    return sorted(seen, key=seen.get, reverse=True)[:top]


def matmul_rate(shape: LinearShape, dtype: torch.dtype, device: str, seconds: float = 0.5) -> float:
    """GFLOP/s of (rows x inputs) @ (inputs x outputs) in `dtype`, a linear layer's forward
    product, repeated for about `seconds` after one warm-up call."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(shape.rows, shape.inputs, generator=generator).to(device, dtype)
    w = torch.randn(shape.outputs, shape.inputs, generator=generator).to(device, dtype)
    torch.nn.functional.linear(a, w)
    calls, start = 0, time.perf_counter()
    while True:
        torch.nn.functional.linear(a, w)
        calls += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return shape.flops * calls / elapsed / 1e9


def matmul_peaks(shapes: list[LinearShape], precisions: list[str], device: str) -> dict:
    """Per precision: GFLOP/s on each model shape and on a SQUARE^3 product, measured side by
    side (precisions alternate per shape), and the best of them: the peak a phase is held to."""
    square = LinearShape(SQUARE, SQUARE, SQUARE)
    rates: dict[str, dict[str, float]] = {p: {} for p in precisions}
    for shape in [*shapes, square]:
        for precision in precisions:
            rates[precision][str(shape)] = matmul_rate(shape, DTYPES[precision], device)
    return {p: {"gflops": r, "square": r[str(square)], "peak": max(r.values())} for p, r in rates.items()}


def step_limit(module, strategies: dict, samplers: dict, prompts: list[str], metadata: list[dict], group_ids: torch.Tensor,
               micro_batches: int, rollout_of: Callable, device: str, precisions: list[str]) -> dict:
    """`bench step limit=true`: FLOPs of each phase on the last round's prompts (float32: a precision changes no count) and
    the matmul peaks of each precision, measured after the timed rounds."""
    flops: dict = {"rollout": {}, "reward": {}, "gradient": {}}
    for spec in samplers:
        flops["rollout"][spec], rollout = count_flops(lambda: rollout_of(spec, prompts, 0))
        flops["reward"][spec], components = count_flops(
            lambda: module.reward.components(module.policy.decode(rollout.final), prompts, metadata))
        scores = check_scores(components["reward"], len(prompts), module.reward.name).float().to(device)
        advantages = module.advantages(scores, group_ids, 0)
        for name, strategy in strategies.items():
            flops["gradient"][name, spec], _ = count_flops(
                lambda: gradient_phase(module, strategy, rollout, advantages, device, micro_batches=micro_batches))
            module.policy.zero_grad(set_to_none=True)
    # the shapes of one rollout call, its rows as the rollout batches them
    x = torch.zeros(len(prompts), *module.policy.sample_shape, device=device)
    with torch.inference_mode():
        cond = module.policy.encode_prompts(prompts)
        null_cond = module.policy.encode_prompts([""])
        velocity = guided_velocity_fn(module.policy, cond, null_cond, module.sampler.guidance)
        shapes = linear_shapes(module.policy, lambda: velocity(x, torch.full((len(prompts),), 0.5, device=device)))
    peaks = matmul_peaks(shapes, list(dict.fromkeys([*precisions, *DTYPES])), device)  # both dtypes, whatever ran
    return {"flops": {phase: {"/".join(k) if isinstance(k, tuple) else k: v for k, v in per.items()} for phase, per in flops.items()},
            "model_shapes": [str(s) for s in shapes], "peaks": peaks,
            "bf16_over_float32": {"peak": peaks["bf16-mixed"]["peak"] / peaks["32-true"]["peak"],
                                  "square": peaks["bf16-mixed"]["square"] / peaks["32-true"]["square"]},
            "cpu_bf16": [] if device.startswith("cuda") else cpu_bf16_flags()}


def achieved(row: dict, limit: dict, name: str, spec: str, per_rollout: int) -> dict:
    """A row's GFLOP per phase (per optimizer step) and each phase's share of its precision's peak."""
    peak = limit["peaks"][row["precision"]]["peak"]
    gflop = {"rollout": limit["flops"]["rollout"][spec] / per_rollout / 1e9,
             "reward": limit["flops"]["reward"][spec] / per_rollout / 1e9,
             "gradient": limit["flops"]["gradient"][f"{name}/{spec}"] / per_rollout / 1e9}
    out = {f"{phase}_gflop": value for phase, value in gflop.items()}
    for phase in ("rollout", "gradient"):
        out[f"{phase}_gflops_per_s"] = gflop[phase] / row[f"{phase}_s"]
        out[f"{phase}_peak_share"] = out[f"{phase}_gflops_per_s"] / peak
    out["step_gflop"] = sum(gflop.values())
    out["step_peak_share"] = out["step_gflop"] / row["step_s"] / peak
    return out


LIMIT_COLUMNS = [("experiment", "experiment", "{}"), ("rollout", "rollout", "{}"), ("precision", "precision", "{}"),
                 ("rollout_gflop", "rollout GFLOP", "{:.1f}"), ("rollout_gflops_per_s", "rollout GFLOP/s", "{:.0f}"),
                 ("rollout_peak_share", "rollout share of peak", "{:.2f}"), ("gradient_gflop", "gradient GFLOP", "{:.1f}"),
                 ("gradient_gflops_per_s", "gradient GFLOP/s", "{:.0f}"), ("gradient_peak_share", "gradient share of peak", "{:.2f}"),
                 ("step_peak_share", "step share of peak", "{:.2f}")]


def limit_table(report: dict) -> str:
    """The phases against the machine: FLOPs, achieved GFLOP/s and share of the precision's peak,
    then the matmul rates measured per precision (GFLOP/s)."""
    peaks = report["limit"]["peaks"]
    shapes = list(next(iter(peaks.values()))["gflops"])
    lines = ["| matmul (rows x in x out) | " + " | ".join(f"{p} GFLOP/s" for p in peaks) + " |",
             "|---|" + "---|" * len(peaks)]
    lines += [f"| {shape} | " + " | ".join(f"{peaks[p]['gflops'][shape]:.0f}" for p in peaks) + " |" for shape in shapes]
    ratio, flags = report["limit"]["bf16_over_float32"], report["limit"]["cpu_bf16"]
    lines += ["", f"bf16 matmul over float32: {ratio['peak']:.2f}x at the peaks, {ratio['square']:.2f}x on the square; "
              f"native bf16 instructions: {', '.join(flags) if flags else 'none'} "
              f"(torch CPU capability {report['machine'].get('cpu_capability', '?')})"]
    return markdown_table(report["rows"], LIMIT_COLUMNS) + "\n\n" + "\n".join(lines)
