"""`bench step`: where a whole training step's time goes, per strategy and rollout setting.

    python -m jagg_lab.bench step "experiments=[full,subsample_w6]" "rollouts=[sde,euler:1,euler:1+compile]" out=FILE.json
    python -m jagg_lab.bench step "experiments=[subsample_w6,full]" "precisions=[32-true,bf16-mixed]" limit=true out=FILE.json
    python -m jagg_lab.bench step "experiments=[full,subsample_w6,awm,nft,flow_grpo_fast,mixgrpo]" "rollouts=[sde]" out=FILE.json
    python -m jagg_lab.bench step "experiments=[subsample_w6,awm]" "rollouts=[sde]" rounds=1 profile=true out=FILE.json

Users pay for whole steps: the rollout (SDE sampling, no grad), the reward, and the gradient
phase. Each round draws one prompt batch of the training stream (as `bench arms` does), then
for every rollout setting samples it (the same prompts and noise: the SDE steps see the same
draws whatever the tail) and scores it, and runs every experiment's gradient phase on it; the
order is rotated each round. Per experiment x rollout setting: seconds of the rollout, the
reward and the gradient phase (medians over rounds), their sum (the step), and its ratio to
the reference row's; the rollout's policy calls and rows (each call carries both CFG branches),
reference-policy calls (KL), the gradient phase's forwards and backward items; and the mean
reward the setting's samples got, paired sample by sample with the reference setting's (an ODE
tail must not make the task easier or harder by itself).

A rollout setting is `sde` (as training samples by default), `SOLVER:STEPS` (the steps after
the last trained one by ODE: `sampler.tail_solver=SOLVER sampler.tail_steps=STEPS`; `SOLVER`
alone: as many steps as it replaces), with `+compile` for the rollout's policy calls through
torch.compile (`compile_rollout=true`; its compilation is paid in the warm-up rounds).

Experiments that sample their own rollouts, a forward-process objective (`awm`, `nft`: ODE
rollouts) or a moving SDE window (`flow_grpo_fast`, `mixgrpo`), get one row each (rollout `own`),
timed in each round after the shared settings on the same prompts and noise seeds, with the
training step's own gradient phase; the first experiment must be a trajectory one (it sets the
shared rollout).

`precisions` runs every setting in each of these `trainer.precision` values (32-true, bf16-mixed:
the transformer under bfloat16 autocast, as Lightning's plugin runs training_step), rollout and
gradient phase alike; each row reports the on-policy step's clip_frac and ratio_mean, and its
reward paired with the reference row's. `limit=true` adds what the machine could do (see
`jagg_lab.bench.limit`): FLOPs per phase, the matmul peak of each precision on the model's
largest linear shapes and a large square, and each phase's achieved share of its precision's peak.
`compile_gradient=true` adds a row EXPERIMENT+compile per shared-rollout experiment: its gradient phase
with the policy's forward and backward through torch.compile, on the same rollouts (compiled in the
warm-up rounds). `profile=true` adds one more step per experiment under torch.profiler and keeps its ops ranked by
self CPU time (`jagg_lab.bench.profile`): where the time goes that the FLOP count leaves out.
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from jagg_lab import cli
from jagg_lab.bench.arms import OWN, _configs as experiment_configs, own_rollout_module, own_step, owns_rollouts, unused_settings
from jagg_lab.bench.common import (
    check_device,
    check_minimum,
    check_precisions,
    command_line,
    gradient_phase,
    machine,
    precision_context,
    sync,
    training_setting,
    write_json,
)
from jagg_lab.bench.limit import achieved, limit_table, step_limit
from jagg_lab.bench.profile import MATMUL_OPS, one_steps, profile_steps, profile_table
from jagg_lab.bench.report import markdown_table
from jagg_lab.rewards.base import check_scores
from jagg_lab.sampling.rollout import ODE_SOLVERS

__all__ = ["StepArgs", "RolloutSetting", "parse_rollout", "bench_step", "table", "limit_table", "profile_table", "main"]

PROG = "python -m jagg_lab.bench step"


@dataclass(frozen=True)
class RolloutSetting:
    """How a rollout is sampled: the tail's ODE solver and steps (None: the SDE) and compilation."""

    name: str
    tail_solver: str | None = None
    tail_steps: int | None = None
    compile: bool = False


def parse_rollout(spec: str) -> RolloutSetting:
    """`sde`, `SOLVER`, `SOLVER:STEPS`, each optionally with `+compile`; ValueError naming `rollouts`."""
    base, plus, flag = spec.partition("+")
    if plus and flag != "compile":
        raise ValueError(f"rollouts: {spec!r}: the only suffix is +compile")
    solver, _, steps = base.partition(":")
    if solver == "sde" and not steps:
        return RolloutSetting(spec, compile=bool(plus))
    if solver not in ODE_SOLVERS or (steps and not (steps.isdigit() and int(steps) >= 1)):
        raise ValueError(f"rollouts: {spec!r} is not sde or SOLVER[:STEPS] with SOLVER in {ODE_SOLVERS} and STEPS >= 1")
    return RolloutSetting(spec, solver, int(steps) if steps else None, bool(plus))


@dataclass
class StepArgs:
    """Whole-step time per experiment x rollout setting, side by side on the same prompt batches
    (see `python -m jagg_lab.bench step`'s module docstring)."""

    out: str | None = None  # a new JSON file for the report (None: print only)
    experiments: list[str] = field(default_factory=lambda: ["full", "subsample_w6"])  # +experiment=... (only the strategy may differ)
    rollouts: list[str] = field(default_factory=lambda: ["sde", "euler:1"])  # rollout settings (module docstring)
    precisions: list[str] = field(default_factory=lambda: ["32-true"])  # trainer.precision values, each setting in each
    reference: str | None = None  # "EXPERIMENT/ROLLOUT[/PRECISION]" the ratios are of (None: the first of each)
    limit: bool = False  # also count FLOPs per phase and measure the matmul peak of each precision
    profile: bool = False  # also profile one more step per experiment (torch.profiler): its ops by self CPU time
    compile_gradient: bool = False  # also each shared-rollout experiment's gradient phase compiled (rows EXPERIMENT+compile)
    profile_top: int = 15  # ops kept per profiled step
    overrides: list[str] = field(default_factory=list)  # training-config overrides for every experiment
    rounds: int = 5  # timed rounds, one prompt batch each
    warmup: int = 1  # untimed rounds before them (compilation happens here)
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.rollouts or len(set(self.rollouts)) != len(self.rollouts):
            raise ValueError(f"rollouts: a non-empty list without repeats, got {self.rollouts}")
        for spec in self.rollouts:
            parse_rollout(spec)
        check_precisions("precisions", self.precisions)
        if self.reference is not None:
            experiment, _, rest = self.reference.partition("/")
            rollout, _, precision = rest.partition("/")
            if experiment not in self.experiments or rollout not in self.rollouts or (precision and precision not in self.precisions):
                raise ValueError(f"reference: {self.reference!r} is not EXPERIMENT/ROLLOUT[/PRECISION] of {self.experiments} x "
                                 f"{self.rollouts} x {self.precisions}")
        check_minimum(self, {"rounds": 1, "warmup": 0, "profile_top": 1})
        check_device(self.device)
        if self.out is not None and Path(self.out).exists():
            raise ValueError(f"out: {self.out} already exists; choose a new file")


def _configs(args: StepArgs) -> dict:
    """The experiments' training configs (checked as `bench arms` checks them) and each rollout
    setting's sampler, checked against the trained steps; ValueError naming the bad key."""
    arms = experiment_configs(args, own_rollouts=True)  # the same experiments / reference / overrides keys
    first = arms[args.experiments[0]]
    base = instantiate(first.sampler)
    trained = instantiate(first.grpo).trained_steps(base.num_steps)
    samplers = {}
    for spec in args.rollouts:
        setting = parse_rollout(spec)
        sampler = dataclasses.replace(base, tail_solver=setting.tail_solver, tail_steps=setting.tail_steps)
        try:
            sampler.ode_phases(trained)
        except ValueError as err:
            raise ValueError(f"rollouts: {spec}: {err}") from None
        samplers[spec] = (setting, sampler)
    return {"experiments": arms, "samplers": samplers}


def _paired(values: list[float], reference: list[float]) -> tuple[float, float]:
    """Mean and standard error of the per-sample differences."""
    diffs = [a - b for a, b in zip(values, reference)]
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan


def bench_step(args: StepArgs, progress: Callable[[str], None] = lambda line: None, configs: dict | None = None) -> dict:
    configs = configs or _configs(args)
    arms, samplers = configs["experiments"], configs["samplers"]
    first = arms[args.experiments[0]]
    module, data = training_setting(first, args.seed, args.device)
    own = {name: own_rollout_module(cfg, module) for name, cfg in arms.items() if owns_rollouts(cfg)}
    strategies = {name: instantiate(cfg.strategy) for name, cfg in arms.items() if name not in own}
    compiled_policy = torch.compile(module.policy) if args.compile_gradient else None  # compiles in the warm-up round
    compiled_phases = {f"{name}+compile": name for name in strategies} if args.compile_gradient else {}  # -> its eager twin
    strategies.update({name: strategies[eager] for name, eager in compiled_phases.items()})
    micro_batches = data.samples_per_step // module.grpo.micro_batch_size
    per_rollout = module.grpo.optimizer_steps_per_rollout
    guidance_rows = 2 if module.sampler.guidance != 1.0 else 1
    ref_calls = len(module.objective.trained_steps) if module.objective.ref_policy is not None else 0
    compiled = [None]  # the rollout's compile setting now

    # a row per experiment x rollout setting x precision; a rollout per rollout setting x precision
    settings = [(spec, precision) for precision in args.precisions for spec in samplers]
    times = {(e, r, p): {"rollout": [], "reward": [], "gradient": []} for e in strategies for r, p in settings}
    times.update({(e, OWN, p): {"rollout": [], "reward": [], "gradient": []} for e in own for p in args.precisions})
    work = {key: {} for key in times}
    # rewards of each rollout: (setting, precision), or (OWN:experiment, precision) for those with their own
    rewards = {key: [] for key in [*settings, *((f"{OWN}:{e}", p) for e in own for p in args.precisions)]}
    strict = {key: [] for key in rewards}
    calls = {}
    stream = iter(data.train_dataloader())
    load_start, start = os.getloadavg(), time.perf_counter()
    names = list(strategies)

    def rollout_of(spec: str, prompts: list[str], index: int):
        setting, sampler = samplers[spec]
        if compiled[0] != setting.compile:
            module.compile_rollout(setting.compile)
            compiled[0] = setting.compile
        module.policy.eval()  # the training step's noise for rollout `index`
        return module.make_rollout(prompts, module.rollout_generator(index), index, sampler=sampler)

    for i in range(args.warmup + args.rounds):
        batch = next(stream)
        prompts, metadata, group_ids = module.groups(batch)
        timed = i >= args.warmup
        rotate = i % len(settings)
        for spec, precision in settings[rotate:] + settings[:rotate]:
            with precision_context(precision, args.device):
                sync(args.device)
                t0 = time.perf_counter()
                rollout = rollout_of(spec, prompts, i)
                sync(args.device)
                t1 = time.perf_counter()
                components = module.reward.components(module.policy.decode(rollout.final), prompts, metadata)
                scores = check_scores(components["reward"], len(prompts), module.reward.name).float().to(args.device)
                t2 = time.perf_counter()
                advantages = module.advantages(scores, group_ids, i)
                calls[spec] = rollout.forwards
                if timed:
                    rewards[spec, precision] += scores.tolist()
                    if "strict" in components:
                        strict[spec, precision] += components["strict"].float().tolist()
                for name in names[rotate % len(names):] + names[:rotate % len(names)]:
                    losses = []
                    seconds, stats = gradient_phase(module, strategies[name], rollout, advantages, args.device,
                                                    micro_batches=micro_batches, steps=losses, index=i,
                                                    forward=compiled_policy if name in compiled_phases else None)
                    stats["clip_frac"] = torch.stack([s.clip_frac for s in losses]).mean().item()
                    stats["ratio_mean"] = torch.stack([s.ratio_mean for s in losses]).mean().item()
                    if timed:
                        entry = times[name, spec, precision]
                        entry["rollout"].append(t1 - t0)
                        entry["reward"].append(t2 - t1)
                        entry["gradient"].append(seconds)
                        for key in ("backward_items", "grad_forwards", "nograd_forwards", "clip_frac", "ratio_mean"):
                            work[name, spec, precision].setdefault(key, []).append(stats.get(key, 0))
                module.policy.zero_grad(set_to_none=True)
                del rollout
        for name, own_module in own.items():
            for precision in args.precisions:
                with precision_context(precision, args.device):
                    seconds, scores, components, stats = own_step(own_module, prompts, metadata, group_ids, i, args.device)
                    calls[f"{OWN}:{name}"] = stats.pop("rollout_forwards")
                    if timed:
                        entry = times[name, OWN, precision]
                        for phase, value in seconds.items():
                            entry[phase].append(value)
                        rewards[f"{OWN}:{name}", precision] += scores.tolist()
                        if "strict" in components:
                            strict[f"{OWN}:{name}", precision] += components["strict"].float().tolist()
                        for key in ("backward_items", "grad_forwards", "nograd_forwards", "clip_frac", "ratio_mean"):
                            work[name, OWN, precision].setdefault(key, []).append(stats.get(key, 0))
        progress(f"round {i + 1}/{args.warmup + args.rounds} ({'warm-up' if not timed else 'timed'}), "
                 f"{time.perf_counter() - start:.0f} s")
    wall = time.perf_counter() - start
    eager = {name: strategy for name, strategy in strategies.items() if name not in compiled_phases}
    # FLOPs are counted once per strategy: a compiled phase does the same work as its eager twin
    limit = (step_limit(module, eager, samplers, prompts, metadata, group_ids, micro_batches, rollout_of, args.device,
                        args.precisions) if args.limit else None)
    profiles = profile_steps(one_steps(module, own, eager, settings[0], rollout_of, prompts, metadata, group_ids, micro_batches,
                                        args.device), args.device, args.profile_top) if args.profile else None
    trained = {name: len(module.objective.trained_steps) for name in strategies}
    trained.update({name: len(m.grpo.trained_steps(m.sampler.num_steps)) for name, m in own.items()})

    experiment, _, rest = (args.reference or f"{args.experiments[0]}/{args.rollouts[0]}").partition("/")
    ref_rollout, _, ref_precision = rest.partition("/")
    ref_setting = (ref_rollout, ref_precision or args.precisions[0])
    # named as given; with several precisions, always with the one it is in
    reference = f"{experiment}/{ref_rollout}" + (f"/{ref_setting[1]}" if len(args.precisions) > 1 or ref_precision else "")
    samples = len(prompts)
    rows = []
    for (name, spec, precision), entry in times.items():
        medians = {k: statistics.median(v) / (per_rollout if k == "gradient" else 1) for k, v in entry.items()}
        step = medians["rollout"] / per_rollout + medians["reward"] / per_rollout + medians["gradient"]
        counted = work[name, spec, precision]
        key = f"{OWN}:{name}" if spec == OWN else spec
        reward_gain, reward_se = _paired(rewards[key, precision], rewards[ref_setting])
        setting = samplers[spec][0] if spec != OWN else RolloutSetting(OWN)
        if name in own:  # a forward-process objective's reference calls are part of its gradient phase
            kl_calls = trained[name] if own[name].objective.trajectory and own[name].objective.ref_policy is not None else 0
        else:
            kl_calls = ref_calls
        row = {
            "experiment": name, "rollout": spec, "precision": precision,
            "tail": None if setting.tail_solver is None else [setting.tail_solver, setting.tail_steps],
            "compile": setting.compile, "gradient_compile": name in compiled_phases,
            "rollout_calls": calls[key], "rollout_rows": calls[key] * samples * guidance_rows, "reference_calls": kl_calls,
            "rollout_s": medians["rollout"] / per_rollout, "reward_s": medians["reward"] / per_rollout,
            "gradient_s": medians["gradient"], "step_s": step,
            "backward_items": statistics.fmean(counted["backward_items"]) / per_rollout,
            "gradient_forwards": statistics.fmean(a + b for a, b in zip(counted["grad_forwards"], counted["nograd_forwards"])) / per_rollout,
            "clip_frac": max(counted["clip_frac"]), "ratio_mean": statistics.fmean(counted["ratio_mean"]),
            "reward_mean": statistics.fmean(rewards[key, precision]), "reward_vs_reference": reward_gain, "reward_vs_reference_se": reward_se,
            "rounds_s": {k: v for k, v in entry.items()},
        }
        if strict[key, precision]:
            row["strict_mean"] = statistics.fmean(strict[key, precision])
            row["strict_vs_reference"], row["strict_vs_reference_se"] = _paired(strict[key, precision], strict[ref_setting])
        row["rollout_share"] = row["rollout_s"] / step
        if limit is not None and spec != OWN:
            row.update(achieved(row, limit, compiled_phases.get(name, name), spec, per_rollout))
        rows.append(row)
    ref = next(r for r in rows if (r["experiment"], r["rollout"], r["precision"]) == (experiment, *ref_setting))
    for row in rows:
        row["step_speedup"] = ref["step_s"] / row["step_s"]
        row["gradient_speedup"] = ref["gradient_s"] / row["gradient_s"]
        row["rollout_speedup"] = ref["rollout_s"] / row["rollout_s"]
    notes = [f"seconds are medians over {args.rounds} timed rounds after {args.warmup} warm-up round(s), per optimizer "
             "step (a rollout's and its reward's divided by grpo.optimizer_steps_per_rollout); every rollout setting "
             "samples each round's prompt batch with the same noise in every precision, every experiment's gradient "
             "phase runs on each, the order rotated each round",
             "step = rollout + reward + gradient phase; the optimizer step, the same for every row, is left out, so "
             "the weights stay the base's",
             "rollout_calls: policy calls of one rollout (each with both CFG branches: rollout_rows counts rows); "
             "reference_calls: the KL reference's calls (0 without KL)",
             "reward_vs_reference: mean per-sample reward difference against the reference row's rollout setting and "
             "precision on the same prompts and noise, with its standard error",
             "clip_frac: the largest share of clipped ratios over the timed rounds of the on-policy step; ratio_mean: "
             "their mean ratio (1 on-policy whatever the precision: see GRPOLoss)",
             f"rollout {OWN!r}: an experiment that samples its own rollouts (a forward-process objective: ODE; a moving "
             "SDE window: ODE around it) on the same prompts and noise seeds, timed in each round after the shared "
             "ones; its gradient phase is the training step's own (module.accumulate_gradients, the optimizer step "
             "left out), its reward paired with the reference row's samples"]
    for name, cfg in arms.items():  # what training would refuse, timed anyway: said, never silent
        for line in unused_settings(name, cfg):
            notes.append(f"not used: {line}")
    if compiled_phases:
        notes.append("EXPERIMENT+compile: the experiment's gradient phase with the policy's forward (and so its backward) "
                     "through torch.compile (inductor), on the same rollouts; its compilation is paid in the warm-up "
                     "round(s), so warmup >= 1 keeps it out of the medians")
    if profiles is not None:
        notes.append("profile: one more step per experiment after the timed rounds (its rollout in the first rollout setting "
                     "and precision, reward and gradient phase) under torch.profiler; ops ranked by self CPU time, "
                     f"the top {args.profile_top} kept; matmul_share: the step's self CPU time in {', '.join(MATMUL_OPS)}")
    if limit is not None:
        notes.append("gflop: torch.utils.flop_counter's count of one phase (matrix products, convolutions, attention; "
                     "elementwise work counts nothing), per optimizer step; *_peak_share: the phase's GFLOP/s over the "
                     "best matmul GFLOP/s measured in its precision (limit.peaks)")
    return {
        "command": command_line(args, PROG), "args": asdict(args), "reference": reference,
        "setting": {group: OmegaConf.to_container(first[group], resolve=True) for group in ("policy", "sampler", "grpo", "data")},
        "samples_per_rollout": samples, "micro_batches": micro_batches, "optimizer_steps_per_rollout": per_rollout,
        "machine": {**machine(args.device), "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "wall_s": wall, "notes": notes, **({"limit": limit} if limit is not None else {}),
        **({"profile": profiles} if profiles is not None else {}),
        "rows": rows,
    }


COLUMNS = [("experiment", "experiment", "{}"), ("rollout", "rollout", "{}"), ("precision", "precision", "{}"),
           ("rollout_calls", "rollout calls", "{}"),
           ("rollout_s", "rollout s", "{:.2f}"), ("reward_s", "reward s", "{:.3f}"), ("backward_items", "backward items", "{:g}"),
           ("gradient_s", "gradient s", "{:.2f}"), ("step_s", "step s", "{:.2f}"), ("rollout_share", "rollout share", "{:.2f}"),
           ("step_speedup", "step x reference", "{:.2f}"), ("clip_frac", "clip frac", "{:.3f}"), ("reward_mean", "reward", "{:.3f}"),
           ("reward_vs_reference", "reward vs reference", "{:+.3f}"), ("reward_vs_reference_se", "+-", "{:.3f}")]

def table(report: dict) -> str:
    return markdown_table(report["rows"], COLUMNS)


def _main(args: StepArgs) -> int:
    try:
        configs = _configs(args)
    except ValueError as err:
        sys.stderr.write(f"step: {err}\n")
        return 2
    report = bench_step(args, progress=lambda line: sys.stderr.write(line + "\n"), configs=configs)
    if args.out:
        write_json(report, args.out)
    sys.stdout.write(f"reference: {report['reference']}; {args.rounds} timed rounds in {report['wall_s']:.0f} s\n")
    sys.stdout.write(table(report) + "\n")
    if "limit" in report:
        sys.stdout.write("\n" + limit_table(report) + "\n")
    if "profile" in report:
        sys.stdout.write("\n" + profile_table(report) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli.run(_main, StepArgs, PROG, argv)
