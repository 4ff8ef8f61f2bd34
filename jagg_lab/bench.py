"""Benchmarks that print ratios measured side by side in one run.

    python -m jagg_lab.bench strategies out=FILE.json [key=value ...]

`strategies` times the gradient phase (exactly what a training step runs after the
rollout) of full, subsample and jagg (each window and intermediate-velocity mode) on the
SAME rollout micro-batch, round-robin so drift hits all alike, and reports speedup over
full and the cosine of each gradient to the full one.
"""
from __future__ import annotations

import json
import logging
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from jagg_lab.grpo import GRPOConfig, group_advantages
from jagg_lab.module import GRPOModule
from jagg_lab.policies import SHIPPED_CHECKPOINT, DiTPolicy, fill_zero_init_
from jagg_lab.rewards import JpegCompressibility, ShapesVerifierReward
from jagg_lab.sampling import SDESampler
from jagg_lab.strategies import FullStrategy, JaggKnotsStrategy, JaggStrategy, SubsampleStrategy
from jagg_lab.worlds.shapes import sample_prompt

__all__ = ["BenchArgs", "bench_strategies", "main"]

log = logging.getLogger(__name__)


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
    checkpoint = args.checkpoint
    if checkpoint == "shipped" and not SHIPPED_CHECKPOINT.is_file():
        checkpoint = None
    torch.manual_seed(args.seed)
    policy = DiTPolicy(size=args.size, resolution=args.resolution, checkpoint=checkpoint)
    if checkpoint is None:
        return fill_zero_init_(policy, args.seed), "random (zero-init layers filled)"
    return policy, str(SHIPPED_CHECKPOINT if checkpoint == "shipped" else checkpoint)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_strategies(args: BenchArgs) -> dict:
    policy, source = _policy(args)
    module = GRPOModule(
        policy=policy.to(args.device),
        sampler=SDESampler(num_steps=args.num_steps, shift=args.shift, guidance=args.guidance),
        # sd3_random decodes no real image; its JPEG reward only serves to make advantages
        reward=ShapesVerifierReward() if args.policy == "dit" else JpegCompressibility(),
        strategy=FullStrategy(),
        grpo=GRPOConfig(train_fraction=1.0),
        optimizer=lambda params: torch.optim.AdamW(params),
        group_size=args.group_size,
        seed=args.seed,
        sample_every=0,
    ).to(args.device)
    rng = __import__("numpy").random.default_rng(args.seed)
    prompts = [p for p in (sample_prompt(rng, "train") for _ in range(args.prompts)) for _ in range(args.group_size)]
    rollout = module.make_rollout(prompts, torch.Generator().manual_seed(args.seed))
    rewards = module.reward(module.policy.decode(rollout.final), prompts, [{}] * len(prompts)).to(args.device)
    group_ids = torch.arange(args.prompts, device=args.device).repeat_interleave(args.group_size)
    advantages = group_advantages(rewards, group_ids, std="global")
    if torch.all(advantages == 0):  # a constant reward gives no signal to compare gradients on
        advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(args.seed)).to(args.device)
    idx = torch.arange(len(prompts), device=args.device)

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
            module.strategy = strategy
            module.policy.zero_grad(set_to_none=True)
            _sync(args.device)
            start = time.perf_counter()
            out = module.micro_batch_backward(rollout, advantages, idx, 1.0, on_policy=True)
            _sync(args.device)
            if repeat:
                times[(name, w, mode)].append(time.perf_counter() - start)
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


BENCHES = {"strategies": (BenchArgs, bench_strategies)}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        sys.stderr.write(f"usage: python -m jagg_lab.bench {{{'|'.join(BENCHES)}}} [key=value ...]\n")
        return 2
    schema, bench = BENCHES[argv[0]]
    try:
        args = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_cli(argv[1:])))
    except OmegaConfBaseException as err:
        sys.stderr.write(f"jagg_lab.bench: {err}\n")
        return 2
    report = bench(args)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    sys.stdout.write(f"policy: {report['policy']}; {report['samples']} samples x {report['trained_steps']} trained steps; {report['machine']}\n")
    sys.stdout.write(table(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
