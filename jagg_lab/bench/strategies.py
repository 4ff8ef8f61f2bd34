"""`python -m jagg_lab.bench strategies`: the gradient phase of many strategies on one rollout.

Times the gradient phase (exactly what a training step runs after the rollout) of full,
subsample, jagg (each window and intermediate-velocity mode) and the knot variants on the
SAME rollout, round-robin so drift hits all alike, and reports per configuration the time,
speedup over full, peak memory, backward passes and items, the cosine of its gradient to the
full one, and a status: a configuration that runs out of memory is recorded as "oom" and the
benchmark goes on.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from jagg_lab import cli
from jagg_lab.bench import common
from jagg_lab.bench.report import write_strategies
from jagg_lab.policies import DIT_SIZES
from jagg_lab.rewards import JpegCompressibility, ShapesVerifierReward
from jagg_lab.strategies import MODES, FullStrategy, GradientStrategy, JaggKnotsStrategy, JaggStrategy, SubsampleStrategy
from jagg_lab.strategies.core import flat_grad

__all__ = ["StrategiesArgs", "strategy_configs", "bench_strategies", "main"]

PROG = "python -m jagg_lab.bench strategies"
POLICIES = ("dit", "sd3_random")
DTYPES = ("float32", "bfloat16", "float16")

# (strategy, window / knot spacing / knot budget, mode, max_pass_items): one row of the report
Config = tuple[str, int, str, int | None]


@dataclass
class StrategiesArgs:
    """The gradient phase of full, subsample, jagg and the knot variants on one rollout:
    time, speedup over full, backward passes / items, and cosine of each gradient to full's.
    Writes the JSON report to `out` and prints the table."""

    out: str | None = None  # the JSON report (null: print the table only)
    policy: str = "dit"  # dit (the shapes DiT) | sd3_random (SD3.5-Medium's transformer, random weights)
    dtype: str = "bfloat16"  # sd3_random only
    num_layers: int = 24  # sd3_random only (1 for a CPU smoke test)
    checkpoint: str | None = "shipped"  # "shipped" (random weights if absent), a path, or null
    size: str = "S"  # DiT size (dit only)
    resolution: int = 32  # pixels
    prompts: int = 4  # GRPO groups in the rollout
    group_size: int = 8  # samples per prompt
    num_steps: int = 16  # SDE sampling steps, all trained
    shift: float = 3.0  # noise-schedule shift
    guidance: float = 3.0  # CFG scale
    windows: list[int] = field(default_factory=lambda: [2, 4, 8])  # jagg and subsample windows
    modes: list[str] = field(default_factory=lambda: ["cached", "interpolated", "recompute"])  # jagg's intermediate velocities
    knot_spacings: list[int] = field(default_factory=lambda: [2, 3, 4, 7])  # jagg_knots, uniform placement
    knot_budgets: list[int] = field(default_factory=lambda: [4, 6])  # jagg_knots, adaptive and even placement
    max_pass_items: list[Optional[int]] = field(default_factory=lambda: [None])  # jagg / knots rows per bound (1 = full's memory)
    micro_batches: int = 1  # the gradient phase in this many micro-batches, as training's grpo.micro_batch_size does
    gradient_checkpointing: bool = False  # sd3_random only: recompute block activations in backward
    memory_limit_gib: float | None = None  # CUDA: cap allocations (a real OOM past it); CPU: a measured peak over it counts as OOM
    repeats: int = 3  # timed rounds (after one warm-up round)
    device: str = "cpu"  # cpu | cuda[:N]
    seed: int = 0  # prompts, weights, rollout noise

    def __post_init__(self) -> None:
        """Raise ValueError naming the first bad key, before anything is built."""
        if self.out and not Path(self.out).parent.is_dir():
            raise ValueError(f"out: the directory of {self.out} does not exist")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.policy == "dit":
            if self.size not in DIT_SIZES:
                raise ValueError(f"size must be one of {sorted(DIT_SIZES)}, got {self.size!r}")
            common.check_resolution("resolution", self.resolution)
            if self.checkpoint not in (None, "shipped") and not Path(self.checkpoint).is_file():
                raise ValueError(f"checkpoint: no file at {self.checkpoint}")
        common.check_minimum(self, {"num_layers": 1, "resolution": 1, "prompts": 1, "group_size": 1, "repeats": 1,
                                    "windows": 1, "knot_spacings": 1, "knot_budgets": 2, "micro_batches": 1})
        if not self.max_pass_items or any(b is not None and b < 1 for b in self.max_pass_items):
            raise ValueError(f"max_pass_items must list bounds >= 1 or null, got {self.max_pass_items}")
        if self.micro_batches > self.prompts * self.group_size:
            raise ValueError(f"micro_batches ({self.micro_batches}) exceeds the {self.prompts * self.group_size} samples")
        if self.memory_limit_gib is not None and self.memory_limit_gib <= 0:
            raise ValueError(f"memory_limit_gib must be > 0 or null, got {self.memory_limit_gib}")
        if self.policy == "sd3_random" and self.resolution % 16:
            raise ValueError(f"resolution must be a multiple of 16 for sd3_random (VAE factor 8 x patch 2), got {self.resolution}")
        if any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must all be in {MODES}, got {self.modes}")
        common.check_sampling(self.num_steps, self.shift, self.guidance)
        common.check_device(self.device)


def _policy(args: StrategiesArgs) -> tuple[nn.Module, str]:
    if args.policy == "sd3_random":
        from jagg_lab.policies.diffusers import DiffusersPolicy  # diffusers only where it is used

        policy = DiffusersPolicy.sd3_random(resolution=args.resolution, dtype=args.dtype, num_layers=args.num_layers,
                                            seed=args.seed, device=args.device,
                                            gradient_checkpointing=args.gradient_checkpointing)
        checkpointing = ", gradient checkpointing" if args.gradient_checkpointing else ""
        return policy, f"sd3_random ({args.num_layers} layers, {args.resolution} px, {args.dtype}, LoRA{checkpointing})"
    return common.dit_policy(args.size, args.resolution, args.checkpoint, args.seed)


def strategy_configs(args: StrategiesArgs) -> dict[Config, GradientStrategy]:
    """Every strategy of the report, full first (the reference of the speedups and cosines);
    the interpolating ones once per `max_pass_items` bound."""
    configs: dict[Config, GradientStrategy] = {("full", 1, "-", None): FullStrategy()}
    for w in args.windows:
        configs[("subsample", w, "-", None)] = SubsampleStrategy(window=w, choice="fixed")
    for bound in args.max_pass_items:
        for w in args.windows:
            configs.update({("jagg", w, m, bound): JaggStrategy(window=w, mode=m, max_pass_items=bound) for m in args.modes})
        # knots: the row's window holds the spacing (uniform) or the budget (adaptive, even)
        configs.update({("jagg_knots", k, "cached", bound): JaggKnotsStrategy(knot_spacing=k, max_pass_items=bound)
                        for k in args.knot_spacings})
        configs.update({("jagg_knots_adaptive", m, "cached", bound): JaggKnotsStrategy(
            knot_spacing=None, knot_budget=m, max_pass_items=bound) for m in args.knot_budgets})
        # the same budgets placed evenly, for the adaptive-versus-uniform comparison
        for m in args.knot_budgets:
            knots = [round(i * (args.num_steps - 1) / (m - 1)) for i in range(m)]
            configs[("jagg_knots_even", m, "cached", bound)] = JaggKnotsStrategy(knot_spacing=None, knots=knots,
                                                                                  max_pass_items=bound)
    return configs


def _knots(stats: dict) -> list[int]:
    """The knot positions a knots strategy logs as knot_0, knot_1, ... ([] for the others)."""
    return [stats[f"knot_{i}"] for i in range(sum(k.startswith("knot_") for k in stats))]


def bench_strategies(args: StrategiesArgs) -> dict:
    """One rollout, then per strategy: one untimed gradient phase for its peak memory (an
    out-of-memory there, or a CPU peak over the limit, marks it "oom" and it runs no more);
    then round-robin rounds over the others: the first warms up, the next `repeats` are timed
    (median). One result row per strategy."""
    common.limit_memory(args.device, args.memory_limit_gib)
    policy, source = _policy(args)
    # sd3_random decodes no real image; its JPEG reward only serves to make advantages
    reward = ShapesVerifierReward() if args.policy == "dit" else JpegCompressibility()
    module = common.grpo_module(policy, reward, num_steps=args.num_steps, shift=args.shift, guidance=args.guidance,
                                train_fraction=1.0, group_size=args.group_size, seed=args.seed, device=args.device)
    prompts = common.grouped_prompts(args.prompts, args.group_size, args.seed)
    rollout = module.make_rollout(prompts, torch.Generator().manual_seed(args.seed))
    advantages = common.advantages(module, rollout, prompts, args.seed)

    configs = strategy_configs(args)
    params = module.trainable_parameters()

    def phase(strategy: GradientStrategy) -> tuple[float, dict]:
        return common.gradient_phase(module, strategy, rollout, advantages, args.device, args.micro_batches)

    memory, stats = {}, {}
    for key, strategy in configs.items():
        memory[key] = common.measure_memory(lambda: stats.__setitem__(key, phase(strategy)[1]), args.device,
                                            args.memory_limit_gib)
        common.free_memory(module, args.device)
    grads, times = {}, {key: [] for key in configs}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not timed
        for key, strategy in configs.items():
            if memory[key].status != "ok":
                continue
            try:
                seconds, stats[key] = phase(strategy)
            except (torch.OutOfMemoryError, RuntimeError) as err:
                if not common.is_out_of_memory(err):
                    raise
                memory[key].status = "oom"
                common.free_memory(module, args.device)
                continue
            if repeat:
                times[key].append(seconds)
            grads[key] = flat_grad(params).float()
    full = ("full", 1, "-", None)
    t_full = statistics.median(times[full]) if memory[full].status == "ok" else None
    results = []
    for key in configs:
        ok = memory[key].status == "ok"
        t = statistics.median(times[key]) if ok else None
        results.append({
            "strategy": key[0], "window": key[1], "mode": key[2], "max_pass_items": key[3], "status": memory[key].status,
            "time_s": t, "speedup_vs_full": t_full / t if ok and t_full else None,
            "grad_cosine": torch.nn.functional.cosine_similarity(grads[key], grads[full], dim=0).item()
            if ok and full in grads else None,
            "peak_memory_mib": memory[key].peak_mib, "peak_allocated_mib": memory[key].peak_allocated_mib,
            "backward_passes": stats[key]["backward_passes"] if key in stats else None,
            "backward_items": stats[key]["backward_items"] if key in stats else None,
            "nograd_forwards": stats[key]["nograd_forwards"] if key in stats else None,
            "knots": _knots(stats.get(key, {})),
        })
    return {"machine": common.machine(args.device), "policy": source, "settings": asdict(args),
            "memory_method": common.MEMORY_METHODS["cuda" if args.device.startswith("cuda") else "cpu"],
            "trained_steps": len(module.objective.trained_steps), "samples": len(prompts), "results": results}


def main(argv: list[str]) -> int:
    """`key=value ...` -> the report; exit status 2 (nothing built) for a bad key."""
    return cli.run(lambda args: write_strategies(bench_strategies(args), args.out), StrategiesArgs, PROG, argv)
