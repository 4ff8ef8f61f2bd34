"""`bench arms`: what each training experiment's gradient phase costs, timed side by side.

    python -m jagg_lab.bench arms "experiments=[full,jagg_w4,subsample_w6,jagg_cv_w4]" out=FILE.json

Training runs log their gradient-phase seconds (`time_gradient_s` in metrics.csv), but runs
made at different times, or several at once on shared cores, cannot be compared by them. This
benchmark puts the experiments on one footing: each round draws one rollout of the training
stream (rollout i of a run of the first experiment, its noise and advantages), then runs every
experiment's gradient phase on it as its training step would (its strategy from its config, the
micro-batches of grpo.micro_batch_size, from zeroed gradients), in an order rotated each round.
Per experiment: backward items per optimizer step, the median gradient-phase seconds per
optimizer step over the timed rounds, and both as a share of the reference's. The rollouts and
gradient phases run in the experiments' `trainer.precision` (32-true, or bf16-mixed: Lightning's
autocast, as training runs it), which they must share: arms of one table are timed in one
precision. The experiments must agree on every setting but the strategy (the
policy, sampler, reward, data and GRPO settings), else their rollouts would differ; a mismatch
is refused naming the experiment and the key.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from jagg_lab import cli
from jagg_lab.bench.common import (
    PRECISIONS,
    check_device,
    check_minimum,
    command_line,
    gradient_phase,
    machine,
    precision_context,
    sync,
    training_config,
    training_rollout,
    training_setting,
    write_json,
)
from jagg_lab.bench.report import markdown_table
from jagg_lab.module import GRPOModule
from jagg_lab.objectives import trajectory_settings_used
from jagg_lab.rewards.base import check_scores

__all__ = ["ArmsArgs", "SHARED", "OWN", "bench_arms", "own_rollout_module", "own_step", "main"]

PROG = "python -m jagg_lab.bench arms"

# the config groups the experiments must agree on: they make the rollout the strategies share
SHARED = ("policy", "sampler", "reward", "data", "grpo")


@dataclass
class ArmsArgs:
    """Gradient-phase seconds and backward items per training step of each experiment, timed
    round-robin on the same rollouts (see `python -m jagg_lab.bench arms`'s module docstring)."""

    out: str | None = None  # a new JSON file for the report (None: print only)
    experiments: list[str] = field(default_factory=lambda: ["full", "jagg_w4", "subsample_w4"])  # +experiment=...
    reference: str | None = None  # the experiment the shares are of (None: the first)
    overrides: list[str] = field(default_factory=list)  # training-config overrides for every experiment
    rounds: int = 6  # timed rounds, one rollout each
    warmup: int = 1  # untimed rounds before them
    seed: int = 0  # training seed: prompt stream, rollout noise, the strategies' draws
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.experiments or len(set(self.experiments)) != len(self.experiments):
            raise ValueError(f"experiments: a non-empty list without repeats, got {self.experiments}")
        if self.reference is not None and self.reference not in self.experiments:
            raise ValueError(f"reference: {self.reference!r} is not one of the experiments {self.experiments}")
        check_minimum(self, {"rounds": 1, "warmup": 0})
        check_device(self.device)
        if self.out is not None and Path(self.out).exists():
            raise ValueError(f"out: {self.out} already exists; choose a new file")


def _configs(args: ArmsArgs, own_rollouts: bool = False) -> dict:
    """Each experiment's training config; ValueError naming the experiment whose composition
    fails or whose shared settings differ from the first's, before any model is built.
    own_rollouts (`bench step`): an experiment may sample its own rollouts, with another objective
    (objective=awm | nft) or a moving SDE window (grpo.sde_window*); `bench arms` times strategies on
    one shared rollout and refuses both."""
    configs = {}
    for name in args.experiments:
        try:
            configs[name] = training_config(name, args.seed, args.overrides)
        except ValueError as err:
            raise ValueError(f"experiments: {name}: {err}") from None
    first, *rest = args.experiments
    for name, cfg in configs.items():  # one precision for every arm, one the benchmark can run
        precision = _precision(cfg)
        if precision not in PRECISIONS:
            raise ValueError(f"experiments: {name} trains with trainer.precision={precision}; this benchmark runs {list(PRECISIONS)}")
        if precision != _precision(configs[first]):
            raise ValueError(f"experiments: {name} trains with trainer.precision={precision} but {first} with "
                             f"{_precision(configs[first])}; time the arms of one table in one precision")
    for name, cfg in configs.items():
        if owns_rollouts(cfg) and (not own_rollouts or name == first):
            raise ValueError(f"experiments: {name} samples its own rollouts (objective={cfg.objective._target_.rsplit('.', 1)[-1]}"
                             f", grpo.sde_window={cfg.grpo.get('sde_window')}): "
                             + ("time it with bench step" if not own_rollouts else
                                "the first experiment sets the shared rollout: put a trajectory experiment first"))
        objective_of(name, cfg)  # a bad objective value is refused before any model is built
    for name in rest:
        for group in SHARED:
            a, b = (OmegaConf.to_container(configs[n][group], resolve=True) for n in (first, name))
            if own_rollouts and owns_rollouts(configs[name]) and group == "grpo":
                a, b = ({k: v for k, v in d.items() if not k.startswith("sde_window")} for d in (a, b))
            if a != b:
                keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                raise ValueError(f"experiments: {name} differs from {first} in {', '.join(f'{group}.{k}' for k in keys)}; "
                                 "only the strategy may differ")
    return configs


def objective_of(name: str, cfg):
    """The experiment's objective, built (cheap: its constructor checks its values), or None for
    the trajectory objective's default; ValueError naming the experiment on a bad value."""
    try:
        return instantiate(cfg.objective) if cfg.get("objective") else None
    except Exception as err:  # hydra wraps the constructor's ValueError
        raise ValueError(f"experiments: {name}: objective: {err}") from None


def unused_settings(name: str, cfg) -> list[str]:
    """The shared (overridden) settings a forward-process experiment does not use, one line each,
    as training would refuse them: a benchmark times it anyway and says so in its notes."""
    objective = objective_of(name, cfg)
    return [f"{name}: {why}" for why in trajectory_settings_used(cfg, objective.name)] if objective is not None and not objective.trajectory else []


def owns_rollouts(cfg) -> bool:
    """Whether a training config samples rollouts of its own kind: a forward-process objective
    (ODE rollouts) or a moving SDE window."""
    target = cfg.get("objective", {}).get("_target_")
    trajectory = target is None or get_class(str(target)).trajectory
    return not trajectory or cfg.grpo.get("sde_window") is not None


def _precision(cfg) -> str:
    precision = str(cfg.trainer.get("precision", "32-true"))
    return "32-true" if precision == "32" else precision


def bench_arms(args: ArmsArgs, progress: Callable[[str], None] = lambda line: None, configs: dict | None = None) -> dict:
    configs = configs or _configs(args)
    first = configs[args.experiments[0]]
    module, data = training_setting(first, args.seed, args.device)
    strategies = {name: instantiate(cfg.strategy) for name, cfg in configs.items()}
    micro_batches = data.samples_per_step // module.grpo.micro_batch_size
    per_rollout = module.grpo.optimizer_steps_per_rollout  # optimizer steps per rollout: a step's share of its work
    seconds = {name: [] for name in strategies}
    items = {name: [] for name in strategies}
    stream = iter(data.train_dataloader())
    load_start, start = os.getloadavg(), time.perf_counter()
    names = list(strategies)
    precision = _precision(first)
    for i in range(args.warmup + args.rounds):
        with precision_context(precision, args.device):
            rollout, advantages = training_rollout(module, data, next(stream), i, args.device)
            rotate = i % len(names)
            for name in names[rotate:] + names[:rotate]:
                t, stats = gradient_phase(module, strategies[name], rollout, advantages, args.device, micro_batches=micro_batches,
                                          index=i)
                if i >= args.warmup:
                    seconds[name].append(t)
                    items[name].append(stats["backward_items"])
        module.policy.zero_grad(set_to_none=True)
        progress(f"round {i + 1}/{args.warmup + args.rounds} ({'warm-up' if i < args.warmup else 'timed'}), "
                 f"{time.perf_counter() - start:.0f} s")

    reference = args.reference or args.experiments[0]
    rows = [{"experiment": name, "strategy": OmegaConf.to_container(configs[name].strategy, resolve=True),
             "backward_items": statistics.fmean(items[name]) / per_rollout,
             "gradient_s": statistics.median(seconds[name]) / per_rollout,
             "gradient_s_rounds": seconds[name]} for name in names]
    ref = next(r for r in rows if r["experiment"] == reference)
    for row in rows:
        row["items_vs_reference"] = row["backward_items"] / ref["backward_items"]
        row["time_vs_reference"] = row["gradient_s"] / ref["gradient_s"]
        row["seconds_per_item"] = row["gradient_s"] / row["backward_items"]
    return {
        "command": command_line(args, PROG), "args": asdict(args), "reference": reference, "precision": precision,
        "setting": {group: OmegaConf.to_container(first[group], resolve=True) for group in ("sampler", "grpo", "data")},
        "micro_batches": micro_batches, "optimizer_steps_per_rollout": per_rollout,
        "machine": {**machine(args.device), "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "wall_s": time.perf_counter() - start,
        "notes": [f"gradient_s and backward_items are per optimizer step (a rollout's divided by grpo.optimizer_steps_per_rollout); "
                  f"gradient_s: median over {args.rounds} timed rounds after {args.warmup} warm-up round(s), one training-stream "
                  "rollout per round, every experiment's gradient phase on it, order rotated each round; gradient_s_rounds: "
                  "each round's seconds per rollout",
                  "gradient phase = a training step's work after its rollout (its micro-batches, from zeroed gradients); "
                  "the optimizer step, the same for every experiment, is left out, so the weights stay the base's"],
        "rows": rows,
    }


COLUMNS = [("experiment", "experiment", "{}"), ("backward_items", "backward items / step", "{:g}"),
           ("items_vs_reference", "x reference items", "{:.2f}"), ("gradient_s", "gradient s / step", "{:.2f}"),
           ("time_vs_reference", "x reference time", "{:.2f}"), ("seconds_per_item", "s / item", "{:.3f}")]


def table(report: dict) -> str:
    return markdown_table(report["rows"], COLUMNS)


def _main(args: ArmsArgs) -> int:
    try:
        configs = _configs(args)
    except ValueError as err:
        sys.stderr.write(f"arms: {err}\n")
        return 2
    report = bench_arms(args, progress=lambda line: sys.stderr.write(line + "\n"), configs=configs)
    if args.out:
        write_json(report, args.out)
    sys.stdout.write(f"reference: {report['reference']}; {args.rounds} timed rounds in {report['wall_s']:.0f} s\n")
    sys.stdout.write(table(report) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli.run(_main, ArmsArgs, PROG, argv)


OWN = "own"  # the rollout setting of an experiment that samples its own rollouts


def own_rollout_module(cfg, shared: GRPOModule) -> GRPOModule:
    """A module for an experiment with its own rollouts (`owns_rollouts`), on the shared module's
    policy: its objective, its grpo settings (a window), the shared sampler and reward."""
    return GRPOModule(policy=shared.policy, sampler=shared.sampler, reward=shared.reward, strategy=instantiate(cfg.strategy),
                      grpo=instantiate(cfg.grpo), optimizer=lambda params: None, group_size=shared.group_size,
                      seed=shared.seed, sample_every=0, objective=instantiate(cfg.objective)).to(shared.device)


def own_step(module: GRPOModule, prompts: list[str], metadata: list[dict], group_ids: torch.Tensor, index: int,
              device: str) -> tuple[dict, torch.Tensor, dict, dict]:
    """One training step's rollout, reward and gradient phase of an experiment with its own rollouts:
    (seconds per phase, scores, reward components, the gradient phase's stats with the step's
    clip_frac, ratio_mean and the rollout's policy calls)."""
    module.policy.eval()
    sync(device)
    t0 = time.perf_counter()
    rollout = module.make_rollout(prompts, module.rollout_generator(index), index)
    sync(device)
    t1 = time.perf_counter()
    components = module.reward.components(module.policy.decode(rollout.final), prompts, metadata)
    scores = check_scores(components["reward"], len(prompts), module.reward.name).float().to(device)
    t2 = time.perf_counter()
    advantages = module.advantages(scores, group_ids, index)  # the objective's per-sample weights
    module.policy.zero_grad(set_to_none=True)
    everything = torch.arange(len(prompts), device=device)  # the whole rollout, on-policy, as the shared rows
    sync(device)
    t3 = time.perf_counter()
    stats = module.accumulate_gradients(rollout, advantages, everything, on_policy=True, chunk_size=len(prompts),
                                         index=index)
    sync(device)
    t4 = time.perf_counter()
    means = module.step_means()
    for metric in module.step_metrics.values():
        metric.reset()
    module.policy.zero_grad(set_to_none=True)
    stats.update(clip_frac=means["clip_frac"], ratio_mean=means["ratio_mean"], rollout_forwards=rollout.forwards)
    return {"rollout": t1 - t0, "reward": t2 - t1, "gradient": t4 - t3}, scores, components, stats
