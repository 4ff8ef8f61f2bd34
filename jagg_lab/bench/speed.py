"""`python -m jagg_lab.bench speed`: the speed table.

For each model size x resolution x strategy (full, jagg W = 2/4/8 in cached mode, subsample
W = 4) it times whole GRPO steps (rollout, reward, gradient phase) round-robin over all
configurations in one process, measures each gradient phase's peak memory, and writes
OUT/speed.json, OUT/speed.csv and OUT/speed.md. The model is the shapes DiT (its sizes) or,
with policy=sd3_random, SD3.5-Medium's transformer with random weights: what a whole step of
real-size GRPO costs, and which share of it a strategy saves.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from jagg_lab import cli
from jagg_lab.bench import common
from jagg_lab.bench.report import write_speed
from jagg_lab.policies import DIT_SIZES
from jagg_lab.rewards import JpegCompressibility, ShapesVerifierReward
from jagg_lab.strategies import MODES, FullStrategy, JaggStrategy, SubsampleStrategy

__all__ = ["SCALES", "MEMORY_METHODS", "SpeedArgs", "parse_args", "peak_memory_mib", "bench_speed", "main"]

PROG = "python -m jagg_lab.bench speed"

# Presets: scale=paper sets these keys; keys given on the command line override them.
SCALES: dict[str, dict] = {
    "cpu": {},
    "paper": {"sizes": ["XS", "S", "B"], "resolutions": [16, 32, 64], "prompts": 8, "group_size": 8, "repeats": 5},
}

MEMORY_METHODS = common.MEMORY_METHODS
POLICIES = ("dit", "sd3_random")


@dataclass
class SpeedArgs:
    """Whole GRPO steps of every DiT size x resolution x strategy, round-robin in one process,
    and each gradient phase's peak memory; writes OUT/speed.{json,csv,md}. Defaults are
    scale=cpu (about 10 minutes on 2 cores); scale=paper sets the keys of SCALES["paper"];
    keys given on the command line override both."""

    out: str | None = None  # a new or empty directory
    scale: str = "cpu"  # cpu | paper
    policy: str = "dit"  # dit (the shapes DiT, its `sizes`) | sd3_random (SD3.5-Medium's transformer, random weights)
    num_layers: int = 24  # sd3_random only (1 for a CPU smoke test)
    gradient_checkpointing: bool = False  # sd3_random only: recompute block activations in backward
    max_pass_items: int | None = None  # jagg: batches of B rows per joint pass (1 = full's memory)
    sizes: list[str] = field(default_factory=lambda: ["XS", "S"])  # DIT_SIZES keys (dit only)
    resolutions: list[int] = field(default_factory=lambda: [16, 32])  # pixels
    windows: list[int] = field(default_factory=lambda: [2, 4, 8])  # jagg
    mode: str = "cached"  # jagg's intermediate velocities (the trained default)
    subsample_windows: list[int] = field(default_factory=lambda: [4])  # the equal-budget baseline
    prompts: int = 4  # GRPO groups per step
    group_size: int = 8  # samples per prompt
    num_steps: int = 16  # SDE sampling steps
    train_fraction: float = 1.0  # 16 trained steps: windows of 2, 4 and 8 all tile them
    shift: float = 3.0  # noise-schedule shift
    guidance: float = 3.0  # CFG scale
    repeats: int = 3  # timed rounds
    warmup: int = 1  # untimed rounds before them
    device: str = "cpu"  # cpu | cuda[:N]
    dtype: str = "float32"  # float32 | bfloat16 (dit: torch.autocast, weights stay float32; sd3_random: the weights' dtype)
    seed: int = 0  # prompts, weights, rollout noise

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ValueError naming the first bad key, before anything is built or written."""
        if not self.out:
            raise ValueError("out: required, a new or empty directory for speed.json, speed.csv and speed.md")
        out = Path(self.out)
        if out.exists() and not (out.is_dir() and not any(out.iterdir())):
            raise ValueError(f"out: {out} already exists and is not an empty directory; choose a new one")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {sorted(SCALES)}, got {self.scale!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not self.resolutions:
            raise ValueError("resolutions must not be empty")
        if self.policy == "sd3_random" and any(r % 16 for r in self.resolutions):
            raise ValueError(f"resolutions must be multiples of 16 for sd3_random (VAE factor 8 x patch 2), got {self.resolutions}")
        if self.policy == "dit":
            if not self.sizes or any(s not in DIT_SIZES for s in self.sizes):
                raise ValueError(f"sizes must be a non-empty list of {sorted(DIT_SIZES)}, got {self.sizes}")
            for r in self.resolutions:
                common.check_resolution("resolutions", r)
        common.check_minimum(self, {"windows": 1, "subsample_windows": 1, "prompts": 1, "group_size": 1,
                                    "repeats": 1, "warmup": 0, "num_layers": 1, "resolutions": 1})
        if self.max_pass_items is not None and self.max_pass_items < 1:
            raise ValueError(f"max_pass_items must be >= 1 or null, got {self.max_pass_items}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        common.check_sampling(self.num_steps, self.shift, self.guidance, self.train_fraction)
        common.check_device(self.device)
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")


def parse_args(argv: list[str]) -> SpeedArgs:
    """SpeedArgs from `key=value ...`, with the scale's preset under the command line's own
    keys. Raises cli.HelpRequested or cli.UsageError (naming the key) as cli.parse does."""
    args = cli.parse(SpeedArgs, argv, prog=PROG)
    given = {arg.split("=", 1)[0] for arg in argv}
    preset = {key: value for key, value in SCALES[args.scale].items() if key not in given}
    try:
        return dataclasses.replace(args, **preset)
    except ValueError as err:
        raise cli.UsageError(str(err)) from None


def peak_memory_mib(fn: Callable[[], object], device: str) -> float | None:
    """Peak memory of live tensors while fn() runs, above what was live before it (MiB);
    None when it ran out of memory."""
    return common.measure_memory(fn, device).peak_mib


def _precision(args: SpeedArgs) -> contextlib.AbstractContextManager:
    """The DiT in bfloat16: autocast over the whole step (the weights stay float32); otherwise
    nothing (sd3_random holds its weights in `dtype` itself)."""
    if args.dtype == "bfloat16" and args.policy == "dit":
        return torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _cells(args: SpeedArgs) -> tuple[dict, dict]:
    """(size, resolution) -> a module assembled as training does, and where its weights came from."""
    cells, weights = {}, {}
    for res in args.resolutions:
        for size in (args.sizes if args.policy == "dit" else ["sd3.5m"]):
            if args.policy == "dit":
                policy, weights[size, res] = common.dit_policy(size, res, "shipped", args.seed)
                reward = ShapesVerifierReward()
            else:
                from jagg_lab.policies.diffusers import DiffusersPolicy  # diffusers only where it is used

                policy = DiffusersPolicy.sd3_random(resolution=res, dtype=args.dtype, num_layers=args.num_layers,
                                                    seed=args.seed, device=args.device,
                                                    gradient_checkpointing=args.gradient_checkpointing)
                weights[size, res] = f"random ({args.num_layers} layers, LoRA)"
                reward = JpegCompressibility()  # no VAE: the reward only makes advantages
            cells[size, res] = common.grpo_module(
                policy, reward, num_steps=args.num_steps, shift=args.shift, guidance=args.guidance,
                train_fraction=args.train_fraction, group_size=args.group_size, seed=args.seed, device=args.device)
    return cells, weights


def bench_speed(args: SpeedArgs) -> dict:
    """Whole GRPO steps (rollout, reward, gradient phase) of every size x resolution x strategy,
    round-robin in one process, then one gradient phase each for peak memory; one row each."""
    args.check()  # again: `out` may have been filled since the arguments were parsed
    load_start = os.getloadavg()
    cells, weights = _cells(args)
    strategies = {("full", 1): FullStrategy()}
    strategies.update({("jagg", w): JaggStrategy(window=w, mode=args.mode, max_pass_items=args.max_pass_items)
                       for w in args.windows})
    strategies.update({("subsample", w): SubsampleStrategy(window=w, choice="fixed") for w in args.subsample_windows})
    configs = [(*cell, *name) for cell in cells for name in strategies]
    prompts = common.grouped_prompts(args.prompts, args.group_size, args.seed)

    times = {c: {"rollout": [], "reward": [], "gradient": [], "step": []} for c in configs}
    stats = {}
    for repeat in range(args.warmup + args.repeats):
        # Every configuration of a round samples the same rollout (same noise, unchanged weights).
        generator_seed = args.seed * 1_000_003 + repeat
        # Rotate the order each round so no configuration always runs first (after a cell switch).
        rotate = repeat % len(configs)
        for config in configs[rotate:] + configs[:rotate]:
            module, strategy = cells[config[:2]], strategies[config[2:]]
            with _precision(args):
                common.sync(args.device)
                t0 = time.perf_counter()
                module.policy.eval()
                rollout = module.make_rollout(prompts, torch.Generator().manual_seed(generator_seed))
                common.sync(args.device)
                t1 = time.perf_counter()
                advantages = common.advantages(module, rollout, prompts, args.seed)
                common.sync(args.device)
                t2 = time.perf_counter()
                seconds, stats[config] = common.gradient_phase(module, strategy, rollout, advantages, args.device)
            if repeat >= args.warmup:
                for key, value in (("rollout", t1 - t0), ("reward", t2 - t1), ("gradient", seconds),
                                   ("step", t2 - t0 + seconds)):
                    times[config][key].append(value)
            del rollout, advantages

    # Peak memory, untimed: one more gradient phase per configuration on a fixed rollout.
    peaks = {}
    for cell, module in cells.items():
        with _precision(args):
            module.policy.eval()
            rollout = module.make_rollout(prompts, torch.Generator().manual_seed(args.seed))
            advantages = common.advantages(module, rollout, prompts, args.seed)
            for name, strategy in strategies.items():
                module.policy.zero_grad(set_to_none=True)  # freed outside the measurement
                peaks[(*cell, *name)] = peak_memory_mib(
                    lambda: common.gradient_phase(module, strategy, rollout, advantages, args.device), args.device)
        module.policy.zero_grad(set_to_none=True)
        del rollout, advantages

    medians = {c: {k: statistics.median(v) for k, v in times[c].items()} for c in configs}
    rows = []
    for size, res, name, window in configs:
        config, full = (size, res, name, window), medians[(size, res, "full", 1)]
        rows.append({
            "size": size, "resolution": res, "strategy": name, "window": window,
            "mode": args.mode if name == "jagg" else "-", "weights": weights[size, res],
            "max_pass_items": args.max_pass_items if name == "jagg" else None,
            "samples": len(prompts), "trained_steps": len(cells[size, res].objective.trained_steps),
            "backward_passes": stats[config]["backward_passes"], "backward_items": stats[config]["backward_items"],
            "nograd_forwards": stats[config]["nograd_forwards"],
            "gradient_s": medians[config]["gradient"], "step_s": medians[config]["step"],
            "rollout_s": medians[config]["rollout"], "reward_s": medians[config]["reward"],
            "peak_memory_mib": peaks[config],
            "gradient_speedup": full["gradient"] / medians[config]["gradient"],
            "step_speedup": full["step"] / medians[config]["step"],
        })
    machine = {**common.machine(args.device), "loadavg_start": load_start, "loadavg_end": os.getloadavg()}
    return {
        "machine": machine, "args": asdict(args), "dtype": args.dtype,
        "memory_method": MEMORY_METHODS["cuda" if args.device.startswith("cuda") else "cpu"],
        "notes": [
            "whole step = rollout (SDE, CFG, no grad) + reward (decode, shapes verifier) + group advantages + gradient "
            "phase, each as a training step runs them; the optimizer step (the same for every strategy) is left out "
            "so the weights, and with them every configuration's rollout, stay fixed",
            "gradient phase = the strategy over the whole batch as one on-policy micro-batch, from zeroed gradients",
            f"times are medians of {args.repeats} rounds after {args.warmup} warm-up round(s), round-robin over all "
            "rows (order rotated each round)",
            "speedups are over `full` of the same size and resolution",
            "weights: the shipped checkpoint exists only for DiT-S at 32 px; other cells use random weights "
            "(fill_zero_init_), which changes rewards but not the work done"
            if args.policy == "dit" else "sd3_random: random weights and no VAE; the reward (JPEG size of the "
            "latents shown as an image) only makes advantages, so the reward time is not a real reward's",
        ],
        "rows": rows,
    }


def main(argv: list[str]) -> int:
    """`key=value ...` -> OUT/speed.{json,csv,md}; exit status 2 (nothing built or written) for
    a bad key, 0 after --help."""
    try:
        args = parse_args(argv)
    except cli.HelpRequested as shown:
        sys.stdout.write(shown.text)
        return 0
    except cli.UsageError as err:
        sys.stderr.write(f"speed: {err}\n")
        return 2
    write_speed(bench_speed(args), args.out)
    return 0
