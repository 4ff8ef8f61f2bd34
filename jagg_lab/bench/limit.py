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

__all__ = ["count_flops", "LinearShape", "linear_shapes", "matmul_rate", "matmul_peaks", "SQUARE"]

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
