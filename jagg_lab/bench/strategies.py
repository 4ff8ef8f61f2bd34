"""`python -m jagg_lab.bench strategies`: the gradient phase of many strategies on one rollout.

Times the gradient phase (exactly what a training step runs after the rollout) of full,
subsample, jagg (each window and intermediate-velocity mode) and the knot variants on the
SAME rollout micro-batch, round-robin so drift hits all alike, and reports the speedup over
full and the cosine of each gradient to the full one.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

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

# (strategy, window / knot spacing / knot budget, mode): one row of the report
Config = tuple[str, int, str]


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
                                    "windows": 1, "knot_spacings": 1, "knot_budgets": 2})
        if any(m not in MODES for m in self.modes):
            raise ValueError(f"modes must all be in {MODES}, got {self.modes}")
        common.check_sampling(self.num_steps, self.shift, self.guidance)
        common.check_device(self.device)


def _policy(args: StrategiesArgs) -> tuple[nn.Module, str]:
    if args.policy == "sd3_random":
        from jagg_lab.policies.diffusers import DiffusersPolicy  # diffusers only where it is used

        policy = DiffusersPolicy.sd3_random(resolution=args.resolution, dtype=args.dtype, num_layers=args.num_layers,
                                            seed=args.seed, device=args.device)
        return policy, f"sd3_random ({args.num_layers} layers, {args.resolution} px, {args.dtype}, LoRA)"
    return common.dit_policy(args.size, args.resolution, args.checkpoint, args.seed)


def strategy_configs(args: StrategiesArgs) -> dict[Config, GradientStrategy]:
    """Every strategy of the report, full first (the reference of the speedups and cosines)."""
    configs: dict[Config, GradientStrategy] = {("full", 1, "-"): FullStrategy()}
    for w in args.windows:
        configs[("subsample", w, "-")] = SubsampleStrategy(window=w, choice="fixed")
        configs.update({("jagg", w, m): JaggStrategy(window=w, mode=m) for m in args.modes})
    # knots: the row's window holds the spacing (uniform) or the budget (adaptive, even)
    configs.update({("jagg_knots", k, "cached"): JaggKnotsStrategy(knot_spacing=k) for k in args.knot_spacings})
    configs.update({("jagg_knots_adaptive", m, "cached"): JaggKnotsStrategy(knot_spacing=None, knot_budget=m)
                    for m in args.knot_budgets})
    # the same budgets placed evenly, for the adaptive-versus-uniform comparison
    for m in args.knot_budgets:
        knots = [round(i * (args.num_steps - 1) / (m - 1)) for i in range(m)]
        configs[("jagg_knots_even", m, "cached")] = JaggKnotsStrategy(knot_spacing=None, knots=knots)
    return configs


def _knots(stats: dict) -> list[int]:
    """The knot positions a knots strategy logs as knot_0, knot_1, ... ([] for the others)."""
    return [stats[f"knot_{i}"] for i in range(sum(k.startswith("knot_") for k in stats))]


def bench_strategies(args: StrategiesArgs) -> dict:
    """One rollout, then the gradient phase of every strategy on it, round-robin: the first
    round warms up, the next `repeats` are timed (median). One result row per strategy."""
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
    grads, times, stats = {}, {key: [] for key in configs}, {}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not timed
        for key, strategy in configs.items():
            seconds, stats[key] = common.gradient_phase(module, strategy, rollout, advantages, args.device)
            if repeat:
                times[key].append(seconds)
            grads[key] = flat_grad(params).float()
    full = ("full", 1, "-")
    t_full = statistics.median(times[full])
    results = []
    for key in configs:
        t = statistics.median(times[key])
        results.append({
            "strategy": key[0], "window": key[1], "mode": key[2],
            "time_s": t, "speedup_vs_full": t_full / t,
            "grad_cosine": torch.nn.functional.cosine_similarity(grads[key], grads[full], dim=0).item(),
            "backward_passes": stats[key]["backward_passes"], "backward_items": stats[key]["backward_items"],
            "nograd_forwards": stats[key]["nograd_forwards"], "knots": _knots(stats[key]),
        })
    peak = torch.cuda.max_memory_allocated(args.device) / 2**30 if args.device.startswith("cuda") else None
    return {"machine": {**common.machine(args.device), "peak_memory_gib": peak}, "policy": source,
            "settings": asdict(args), "trained_steps": len(module.objective.trained_steps), "samples": len(prompts),
            "results": results}


def main(argv: list[str]) -> int:
    """`key=value ...` -> the report; exit status 2 (nothing built) for a bad key."""
    return cli.run(lambda args: write_strategies(bench_strategies(args), args.out), StrategiesArgs, PROG, argv)
