"""Benchmarks that print ratios measured side by side in one run.

    python -m jagg_lab.bench strategies out=FILE.json [key=value ...]
    python -m jagg_lab.bench speed out=DIR [scale=cpu|paper] [device=cuda dtype=bfloat16] [key=value ...]

`strategies` times the gradient phase (exactly what a training step runs after the
rollout) of full, subsample and jagg (each window and intermediate-velocity mode) on the
SAME rollout micro-batch, round-robin so drift hits all alike, and reports speedup over
full and the cosine of each gradient to the full one.

`speed` is the speed table: for each DiT size x resolution x strategy (full, jagg W = 2/4/8
in cached mode, subsample W = 4) it times whole GRPO steps (rollout, reward, gradient phase)
round-robin over all configurations in one process, measures each gradient phase's peak
memory, and writes DIR/speed.json, DIR/speed.csv and DIR/speed.md.
"""
from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from safetensors import safe_open

from jagg_lab.grpo import GRPOConfig, group_advantages
from jagg_lab.module import GRPOModule
from jagg_lab.policies import DIT_SIZES, SHIPPED_CHECKPOINT, DiTConfig, DiTPolicy, fill_zero_init_
from jagg_lab.rewards import JpegCompressibility, ShapesVerifierReward
from jagg_lab.rewards.base import check_scores
from jagg_lab.sampling import SDESampler
from jagg_lab.strategies import FullStrategy, GradientStrategy, JaggKnotsStrategy, JaggStrategy, SubsampleStrategy
from jagg_lab.strategies.core import MODES
from jagg_lab.types import Rollout
from jagg_lab.worlds.shapes import sample_prompt

__all__ = ["BenchArgs", "SpeedArgs", "bench_strategies", "bench_speed", "parse_args", "main"]

log = logging.getLogger(__name__)


# ---- shared helpers: one module, one rollout, one timed gradient phase ----------------------
def _dit_policy(size: str, resolution: int, checkpoint: str | None, seed: int) -> tuple[torch.nn.Module, str]:
    """The shapes DiT; "shipped" falls back to random weights where the file is absent or
    made for another size / resolution. Random weights get their zero-init layers filled."""
    if checkpoint == "shipped" and not _shipped_fits(size, resolution):
        checkpoint = None
    torch.manual_seed(seed)
    policy = DiTPolicy(size=size, resolution=resolution, checkpoint=checkpoint)
    if checkpoint is None:
        return fill_zero_init_(policy, seed), "random (zero-init layers filled)"
    return policy, str(SHIPPED_CHECKPOINT if checkpoint == "shipped" else checkpoint)


def _shipped_fits(size: str, resolution: int) -> bool:
    if not SHIPPED_CHECKPOINT.is_file():
        return False
    with safe_open(str(SHIPPED_CHECKPOINT), framework="pt") as f:
        meta = f.metadata() or {}
    return meta.get("size") == size and json.loads(meta.get("config", "{}")).get("resolution") == resolution


def _grpo_module(policy: torch.nn.Module, reward, *, num_steps: int, shift: float, guidance: float,
                 train_fraction: float, group_size: int, seed: int, device: str) -> GRPOModule:
    """A module assembled as training does, with the full strategy until a bench swaps it."""
    return GRPOModule(
        policy=policy.to(device),
        sampler=SDESampler(num_steps=num_steps, shift=shift, guidance=guidance),
        reward=reward,
        strategy=FullStrategy(),
        grpo=GRPOConfig(train_fraction=train_fraction),
        optimizer=lambda params: torch.optim.AdamW(params),
        group_size=group_size,
        seed=seed,
        sample_every=0,
    ).to(device)


def _grouped_prompts(prompts: int, group_size: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [p for p in (sample_prompt(rng, "train") for _ in range(prompts)) for _ in range(group_size)]


def _advantages(module: GRPOModule, rollout: Rollout, prompts: list[str], seed: int) -> torch.Tensor:
    """Reward -> group advantages, as a training step computes them."""
    images = module.policy.decode(rollout.final)
    rewards = check_scores(module.reward(images, prompts, [{}] * len(prompts)), len(prompts), module.reward.name)
    device = rollout.final.device
    group_ids = torch.arange(len(prompts) // module.group_size, device=device).repeat_interleave(module.group_size)
    advantages = group_advantages(rewards.to(device), group_ids, std="global")
    if torch.all(advantages == 0):  # a constant reward gives no signal to compare gradients on
        advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(seed)).to(device)
    return advantages


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _gradient_phase(module: GRPOModule, strategy: GradientStrategy, rollout: Rollout, advantages: torch.Tensor,
                    device: str) -> tuple[float, dict]:
    """What a training step runs after its rollout, on the whole batch as one on-policy
    micro-batch, from zeroed gradients. Returns (seconds, the strategy's stats)."""
    module.strategy = strategy
    module.policy.train()
    module.policy.zero_grad(set_to_none=True)
    idx = torch.arange(rollout.final.shape[0], device=rollout.final.device)
    _sync(device)
    start = time.perf_counter()
    stats = module.micro_batch_backward(rollout, advantages, idx, 1.0, on_policy=True)
    _sync(device)
    return time.perf_counter() - start, stats


def _machine(device: str) -> dict:
    cuda = device.startswith("cuda")
    return {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None, "python": platform.python_version(),
    }


# ---- `strategies`: gradient phases of many strategies on one rollout --------------------------
@dataclass
class BenchArgs:
    out: str | None = None
    policy: str = "dit"  # dit (the shapes DiT) | sd3_random (SD3.5-Medium's transformer, random weights)
    dtype: str = "bfloat16"  # sd3_random only
    num_layers: int = 24  # sd3_random only (1 for a CPU smoke test)
    checkpoint: str | None = "shipped"  # "shipped" (random weights if absent), a path, or null
    size: str = "S"
    resolution: int = 32
    prompts: int = 4
    group_size: int = 8
    num_steps: int = 16
    shift: float = 3.0
    guidance: float = 3.0
    windows: list[int] = field(default_factory=lambda: [2, 4, 8])
    modes: list[str] = field(default_factory=lambda: ["cached", "interpolated", "recompute"])
    knot_spacings: list[int] = field(default_factory=lambda: [2, 3, 4, 7])
    knot_budgets: list[int] = field(default_factory=lambda: [4, 6])  # adaptive placement
    repeats: int = 3
    device: str = "cpu"
    seed: int = 0


def _policy(args: BenchArgs) -> tuple[torch.nn.Module, str]:
    if args.policy == "sd3_random":
        from jagg_lab.policies.diffusers_policy import DiffusersPolicy

        policy = DiffusersPolicy.sd3_random(resolution=args.resolution, dtype=args.dtype, num_layers=args.num_layers,
                                            seed=args.seed, device=args.device)
        return policy, f"sd3_random ({args.num_layers} layers, {args.resolution} px, {args.dtype}, LoRA)"
    if args.policy != "dit":
        raise ValueError(f"policy must be 'dit' or 'sd3_random', got {args.policy!r}")
    return _dit_policy(args.size, args.resolution, args.checkpoint, args.seed)


def bench_strategies(args: BenchArgs) -> dict:
    policy, source = _policy(args)
    # sd3_random decodes no real image; its JPEG reward only serves to make advantages
    reward = ShapesVerifierReward() if args.policy == "dit" else JpegCompressibility()
    module = _grpo_module(policy, reward, num_steps=args.num_steps, shift=args.shift, guidance=args.guidance,
                          train_fraction=1.0, group_size=args.group_size, seed=args.seed, device=args.device)
    prompts = _grouped_prompts(args.prompts, args.group_size, args.seed)
    rollout = module.make_rollout(prompts, torch.Generator().manual_seed(args.seed))
    advantages = _advantages(module, rollout, prompts, args.seed)

    configs = [("full", 1, "-", FullStrategy())]
    for w in args.windows:
        configs.append(("subsample", w, "-", SubsampleStrategy(window=w, choice="fixed")))
        configs += [("jagg", w, m, JaggStrategy(window=w, mode=m)) for m in args.modes]
    # knots: `window` holds the spacing (uniform) or the budget (adaptive)
    configs += [("jagg_knots", k, "cached", JaggKnotsStrategy(knot_spacing=k)) for k in args.knot_spacings]
    configs += [("jagg_knots_adaptive", m, "cached", JaggKnotsStrategy(knot_spacing=None, knot_budget=m)) for m in args.knot_budgets]
    # the same budgets placed uniformly, for the adaptive-versus-uniform comparison
    for m in args.knot_budgets:
        knots = [round(i * (args.num_steps - 1) / (m - 1)) for i in range(m)]
        configs.append(("jagg_knots_even", m, "cached", JaggKnotsStrategy(knot_spacing=None, knots=knots)))

    params = module.trainable_parameters()
    grads, times, stats = {}, {c[:3]: [] for c in configs}, {}
    for repeat in range(args.repeats + 1):  # the first round warms up and is not timed
        for name, w, mode, strategy in configs:
            seconds, out = _gradient_phase(module, strategy, rollout, advantages, args.device)
            if repeat:
                times[(name, w, mode)].append(seconds)
            grads[(name, w, mode)] = torch.cat([p.grad.flatten().float() for p in params])
            stats[(name, w, mode)] = out
    full_key = ("full", 1, "-")
    t_full = statistics.median(times[full_key])
    results = []
    for key in times:
        t = statistics.median(times[key])
        results.append({
            "strategy": key[0], "window": key[1], "mode": key[2],
            "time_s": t, "speedup_vs_full": t_full / t,
            "grad_cosine": torch.nn.functional.cosine_similarity(grads[key], grads[full_key], dim=0).item(),
            "backward_passes": stats[key]["backward_passes"], "backward_items": stats[key]["backward_items"],
            "nograd_forwards": stats[key]["nograd_forwards"],
            "knots": [stats[key][f"knot_{i}"] for i in range(sum(k.startswith("knot_") for k in stats[key]))],
        })
    peak = torch.cuda.max_memory_allocated(args.device) / 2**30 if args.device.startswith("cuda") else None
    machine = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(args.device),
        "peak_memory_gib": peak,
        "cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    return {"machine": machine, "policy": source, "settings": asdict(args), "trained_steps": args.num_steps,
            "samples": len(prompts), "results": results}


def table(report: dict) -> str:
    lines = ["| strategy | W / spacing / budget | mode | backward passes | backward items | time (s) | speedup vs full | grad cosine |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| {r['strategy']} | {r['window']} | {r['mode']} | {r['backward_passes']:.0f} | {r['backward_items']:.0f} | "
                     f"{r['time_s']:.3f} | {r['speedup_vs_full']:.2f}x | {r['grad_cosine']:.4f} |")
    return "\n".join(lines)


def write_strategies(report: dict, args: BenchArgs) -> None:
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(f"policy: {report['policy']}; {report['samples']} samples x {report['trained_steps']} trained steps; {report['machine']}\n")
    sys.stdout.write(table(report) + "\n")


# ---- `speed`: whole GRPO steps per size x resolution x strategy --------------------------------
MEMORY_METHODS = {
    "cuda": "torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated right before "
            "the gradient phase",
    "cpu": "torch.profiler (profile_memory=True) allocation/free events of the CPU allocator: peak of the running sum "
           "of tensor bytes allocated minus freed during the gradient phase (tensors live before it excluded)",
}


@dataclass
class SpeedArgs:
    """Defaults are scale=cpu (about 10 minutes on 2 cores); scale=paper overrides the keys in
    SCALES["paper"]; keys given on the command line override both."""

    SCALES: ClassVar[dict[str, dict]] = {
        "cpu": {},
        "paper": {"sizes": ["XS", "S", "B"], "resolutions": [16, 32, 64], "prompts": 8, "group_size": 8, "repeats": 5},
    }

    out: str | None = None  # a new or empty directory
    scale: str = "cpu"
    sizes: list[str] = field(default_factory=lambda: ["XS", "S"])  # DIT_SIZES keys
    resolutions: list[int] = field(default_factory=lambda: [16, 32])
    windows: list[int] = field(default_factory=lambda: [2, 4, 8])  # jagg
    mode: str = "cached"  # jagg's intermediate velocities (the trained default)
    subsample_windows: list[int] = field(default_factory=lambda: [4])  # the equal-budget baseline
    prompts: int = 4
    group_size: int = 8
    num_steps: int = 16
    train_fraction: float = 1.0  # 16 trained steps: windows of 2, 4 and 8 all tile them
    shift: float = 3.0
    guidance: float = 3.0
    repeats: int = 3  # timed rounds
    warmup: int = 1  # untimed rounds before them
    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16 (torch.autocast over the whole step; weights stay float32)
    seed: int = 0

    def check(self) -> None:
        """Raise ValueError naming the first bad key, before anything is built or written."""
        if not self.out:
            raise ValueError("out: required, a new or empty directory for speed.json, speed.csv and speed.md")
        out = Path(self.out)
        if out.exists() and not (out.is_dir() and not any(out.iterdir())):
            raise ValueError(f"out: {out} already exists and is not an empty directory; choose a new one")
        if self.scale not in self.SCALES:
            raise ValueError(f"scale must be one of {sorted(self.SCALES)}, got {self.scale!r}")
        if not self.sizes or any(s not in DIT_SIZES for s in self.sizes):
            raise ValueError(f"sizes must be a non-empty list of {sorted(DIT_SIZES)}, got {self.sizes}")
        if not self.resolutions:
            raise ValueError("resolutions must not be empty")
        for r in self.resolutions:
            try:
                DiTConfig(vocab_size=1, max_text_length=1, resolution=r)
            except ValueError as err:
                raise ValueError(f"resolutions: {r} does not fit the DiT: {err}") from None
        for key in ("windows", "subsample_windows"):
            if any(w < 1 for w in getattr(self, key)):
                raise ValueError(f"{key} must all be >= 1, got {getattr(self, key)}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for key, low in (("prompts", 1), ("group_size", 1), ("repeats", 1), ("warmup", 0)):
            if getattr(self, key) < low:
                raise ValueError(f"{key} must be >= {low}, got {getattr(self, key)}")
        try:
            SDESampler(num_steps=self.num_steps, shift=self.shift, guidance=self.guidance)
            GRPOConfig(train_fraction=self.train_fraction)
        except ValueError as err:  # their messages name sampler.<key> / grpo.<key>
            raise ValueError(str(err).replace("sampler.", "").replace("grpo.", "")) from None
        if self.device != "cpu" and not (self.device.startswith("cuda") and torch.cuda.is_available()):
            raise ValueError(f"device must be 'cpu' or an available 'cuda[:N]', got {self.device!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")


def _peak_memory_mib(fn: Callable[[], object], device: str) -> float:
    """Peak memory of live tensors while fn() runs, above what was live before it (MiB)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    # The process's RSS would hide reuse of memory freed by earlier configurations (the
    # allocator keeps it); the profiler sees every tensor allocation and free instead.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()  # + on allocation, - on free
        peak = max(peak, live)
    return peak / 2**20


def _precision(device: str, dtype: str) -> contextlib.AbstractContextManager:
    """bfloat16: autocast over the whole step (the weights stay float32); float32: nothing."""
    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()


def bench_speed(args: SpeedArgs) -> dict:
    """Whole GRPO steps (rollout, reward, gradient phase) of every size x resolution x strategy,
    round-robin in one process, then one gradient phase each for peak memory; one row each."""
    args.check()
    load_start = os.getloadavg()
    cells, weights = {}, {}
    for size in args.sizes:
        for res in args.resolutions:
            policy, weights[size, res] = _dit_policy(size, res, "shipped", args.seed)
            cells[size, res] = _grpo_module(policy, ShapesVerifierReward(), num_steps=args.num_steps, shift=args.shift,
                                            guidance=args.guidance, train_fraction=args.train_fraction,
                                            group_size=args.group_size, seed=args.seed, device=args.device)
    strategies = {("full", 1): FullStrategy()}
    strategies.update({("jagg", w): JaggStrategy(window=w, mode=args.mode) for w in args.windows})
    strategies.update({("subsample", w): SubsampleStrategy(window=w, choice="fixed") for w in args.subsample_windows})
    configs = [(*cell, *name) for cell in cells for name in strategies]
    prompts = _grouped_prompts(args.prompts, args.group_size, args.seed)

    times = {c: {"rollout": [], "reward": [], "gradient": [], "step": []} for c in configs}
    stats = {}
    for repeat in range(args.warmup + args.repeats):
        # Every configuration of a round samples the same rollout (same noise, unchanged weights).
        generator_seed = args.seed * 1_000_003 + repeat
        # Rotate the order each round so no configuration always runs first (after a cell switch).
        shift = repeat % len(configs)
        for config in configs[shift:] + configs[:shift]:
            module, strategy = cells[config[:2]], strategies[config[2:]]
            with _precision(args.device, args.dtype):
                _sync(args.device)
                t0 = time.perf_counter()
                module.policy.eval()
                rollout = module.make_rollout(prompts, torch.Generator().manual_seed(generator_seed))
                _sync(args.device)
                t1 = time.perf_counter()
                advantages = _advantages(module, rollout, prompts, args.seed)
                _sync(args.device)
                t2 = time.perf_counter()
                seconds, stats[config] = _gradient_phase(module, strategy, rollout, advantages, args.device)
            if repeat >= args.warmup:
                for key, value in (("rollout", t1 - t0), ("reward", t2 - t1), ("gradient", seconds), ("step", t2 - t0 + seconds)):
                    times[config][key].append(value)
            del rollout, advantages

    # Peak memory, untimed: one more gradient phase per configuration on a fixed rollout.
    peaks = {}
    for cell, module in cells.items():
        with _precision(args.device, args.dtype):
            module.policy.eval()
            rollout = module.make_rollout(prompts, torch.Generator().manual_seed(args.seed))
            advantages = _advantages(module, rollout, prompts, args.seed)
            for name, strategy in strategies.items():
                module.policy.zero_grad(set_to_none=True)  # freed outside the measurement
                peaks[(*cell, *name)] = _peak_memory_mib(
                    lambda: _gradient_phase(module, strategy, rollout, advantages, args.device), args.device)
        module.policy.zero_grad(set_to_none=True)
        del rollout, advantages

    medians = {c: {k: statistics.median(v) for k, v in times[c].items()} for c in configs}
    rows = []
    for size, res, name, window in configs:
        config, full = (size, res, name, window), medians[(size, res, "full", 1)]
        rows.append({
            "size": size, "resolution": res, "strategy": name, "window": window,
            "mode": args.mode if name == "jagg" else "-", "weights": weights[size, res],
            "samples": len(prompts), "trained_steps": len(cells[size, res].trained_steps),
            "backward_passes": stats[config]["backward_passes"], "backward_items": stats[config]["backward_items"],
            "nograd_forwards": stats[config]["nograd_forwards"],
            "gradient_s": medians[config]["gradient"], "step_s": medians[config]["step"],
            "rollout_s": medians[config]["rollout"], "reward_s": medians[config]["reward"],
            "peak_memory_mib": peaks[config],
            "gradient_speedup": full["gradient"] / medians[config]["gradient"],
            "step_speedup": full["step"] / medians[config]["step"],
        })
    machine = {**_machine(args.device), "loadavg_start": load_start, "loadavg_end": os.getloadavg()}
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
            "(fill_zero_init_), which changes rewards but not the work done",
        ],
        "rows": rows,
    }


SPEED_COLUMNS = [("size", "size", "{}"), ("resolution", "res", "{}"), ("strategy", "strategy", "{}"), ("window", "W", "{}"),
                 ("backward_passes", "backward passes", "{:.0f}"), ("backward_items", "backward items", "{:.0f}"),
                 ("gradient_s", "gradient phase (s)", "{:.3f}"), ("gradient_speedup", "speedup (gradient)", "{:.2f}x"),
                 ("step_s", "whole step (s)", "{:.3f}"), ("step_speedup", "speedup (step)", "{:.2f}x"),
                 ("rollout_s", "rollout (s)", "{:.3f}"), ("reward_s", "reward + advantages (s)", "{:.3f}"),
                 ("peak_memory_mib", "gradient peak memory (MiB)", "{:.1f}"), ("weights", "weights", "{}")]


def speed_table(report: dict) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in SPEED_COLUMNS) + " |", "|" + "---|" * len(SPEED_COLUMNS)]
    for row in report["rows"]:
        lines.append("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in SPEED_COLUMNS) + " |")
    return "\n".join(lines)


def write_speed(report: dict, args: SpeedArgs) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):  # filled while we measured
        raise FileExistsError(f"out: {out} is no longer empty; nothing written")
    (out / "speed.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "speed.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(report["rows"][0]))
        writer.writeheader()
        writer.writerows(report["rows"])
    m, a = report["machine"], report["args"]
    header = [
        "# Speed table (`python -m jagg_lab.bench speed`)", "",
        f"Machine: {m['device']}; {m['platform']}; {m['cpu']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads; "
        f"torch {m['torch']}" + (f", CUDA {m['cuda']}" if m["cuda"] else "") + f"; Python {m['python']}; "
        f"load average {m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end.", "",
        f"Settings: {a['prompts']} prompts x {a['group_size']} samples, {a['num_steps']}-step SDE (shift {a['shift']}, "
        f"CFG {a['guidance']}), {report['rows'][0]['trained_steps']} trained steps, {report['dtype']}, "
        f"scale={a['scale']}. Full args in speed.json.", "",
        f"Peak memory: {report['memory_method']}.", "",
    ]
    table_text = speed_table(report)
    notes = ["", *(f"- {note}" for note in report["notes"])]
    (out / "speed.md").write_text("\n".join(header + [table_text] + notes) + "\n")
    sys.stdout.write(table_text + f"\nwrote {out}/speed.json, speed.csv, speed.md\n")


# ---- the command line ---------------------------------------------------------------------------
BENCHES = {"strategies": (BenchArgs, bench_strategies, write_strategies), "speed": (SpeedArgs, bench_speed, write_speed)}


def parse_args(argv: list[str]):
    """[name, key=value ...] -> (name, args). Raises ValueError or OmegaConf's error, naming the key."""
    if not argv or argv[0] not in BENCHES:
        raise ValueError(f"usage: python -m jagg_lab.bench {{{'|'.join(BENCHES)}}} [key=value ...]")
    schema = BENCHES[argv[0]][0]
    base, cli = OmegaConf.structured(schema), OmegaConf.from_cli(argv[1:])
    scales = getattr(schema, "SCALES", None)
    if scales is not None:  # a preset under the command line's own keys
        scale = cli.get("scale", base.scale)
        if scale not in scales:
            raise ValueError(f"scale must be one of {sorted(scales)}, got {scale!r}")
        base = OmegaConf.merge(base, scales[scale])
    args = OmegaConf.to_object(OmegaConf.merge(base, cli))
    if hasattr(args, "check"):
        args.check()
    return argv[0], args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    try:
        name, args = parse_args(argv)
    except (OmegaConfBaseException, ValueError) as err:
        sys.stderr.write(f"jagg_lab.bench: {err}\n")
        return 2
    _, bench, write = BENCHES[name]
    write(bench(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
