"""Where a training step's time goes, op by op: `bench step profile=true`.

After the timed rounds, one more step of every experiment (its rollout, reward and gradient
phase, as the rows time them) runs under `torch.profiler`, and the report keeps its ops ranked
by self CPU time (time in the op itself, not in the ops it calls), with their calls: the table
that shows how much of a step is matrix products and how much is copies, elementwise work,
attention and norms. On a GPU the ops' self CUDA time is kept too.
"""
from __future__ import annotations

from typing import Callable, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

from jagg_lab.bench.arms import OWN, own_step
from jagg_lab.bench.common import gradient_phase, precision_context
from jagg_lab.bench.report import markdown_table
from jagg_lab.rewards.base import check_scores

__all__ = ["op_profile", "one_steps", "profile_steps", "profile_table", "MATMUL_OPS"]

T = TypeVar("T")

# the ops that are matrix products (their share is what FLOP-bound work the step has)
MATMUL_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def op_profile(fn: Callable[[], T], device: str = "cpu", top: int = 15) -> tuple[dict, T]:
    """Run fn() under torch.profiler; its `top` ops by self CPU time and what fn returned.

    Returns {"self_cpu_s": the whole step's self CPU time, "matmul_share": the share of it in
    matrix products (MATMUL_OPS), "ops": [{"op", "self_cpu_s", "share", "calls"[, "self_cuda_s"]}]}.
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        result = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0 or getattr(e, "self_device_time_total", 0) > 0]
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    ops = []
    for e in events[:top]:
        op = {"op": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / 1e6 / total,
              "calls": e.count}
        if device.startswith("cuda"):
            op["self_cuda_s"] = getattr(e, "self_device_time_total", 0) / 1e6
        ops.append(op)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1e6
    return {"self_cpu_s": total, "matmul_share": matmul / total if total else 0.0, "ops": ops}, result


def profile_steps(steps: dict[str, tuple[str, Callable[[], object]]], device: str = "cpu", top: int = 15) -> dict:
    """{name: (setting, one step)} -> {name: op_profile of the step, with its setting}."""
    profiles = {}
    for name, (setting, step) in steps.items():
        profiles[name], _ = op_profile(step, device, top)
        profiles[name]["setting"] = setting
    return profiles


def one_steps(module, own: dict, strategies: dict, setting: tuple[str, str], rollout_of: Callable, prompts: list[str],
               metadata: list[dict], group_ids: torch.Tensor, micro_batches: int, device: str) -> dict:
    """{experiment: (setting, one training step of it as `bench step` times it)}: the shared-rollout
    experiments' rollout in `setting` (rollout, precision), reward and gradient phase; the others' own step."""
    spec, precision = setting

    def shared(strategy) -> None:
        with precision_context(precision, device):
            rollout = rollout_of(spec, prompts, 0)
            components = module.reward.components(module.policy.decode(rollout.final), prompts, metadata)
            scores = check_scores(components["reward"], len(prompts), module.reward.name).float().to(device)
            gradient_phase(module, strategy, rollout, module.advantages(scores, group_ids, 0), device, micro_batches=micro_batches)
            module.policy.zero_grad(set_to_none=True)

    def own_rollouts(own_module) -> None:
        with precision_context(precision, device):
            own_step(own_module, prompts, metadata, group_ids, 0, device)

    steps = {name: (f"rollout {spec}, {precision}", lambda s=strategy: shared(s)) for name, strategy in strategies.items()}
    steps.update({name: (f"rollout {OWN}, {precision}", lambda m=m: own_rollouts(m)) for name, m in own.items()})
    return steps


COLUMNS = [("op", "op", "`{}`"), ("self_cpu_s", "self CPU s", "{:.3f}"), ("share", "share", "{:.1%}"), ("calls", "calls", "{}")]


def profile_table(report: dict) -> str:
    """One table per profiled experiment: its top ops by self CPU time."""
    parts = []
    for name, prof in report["profile"].items():
        parts.append(f"{name}: {prof['self_cpu_s']:.2f} s self CPU in one step ({prof['setting']}), "
                     f"{prof['matmul_share']:.1%} of it in matrix products")
        columns = COLUMNS + ([("self_cuda_s", "self CUDA s", "{:.3f}")] if prof["ops"] and "self_cuda_s" in prof["ops"][0] else [])
        parts.append(markdown_table(prof["ops"], columns))
    return "\n\n".join(parts)
