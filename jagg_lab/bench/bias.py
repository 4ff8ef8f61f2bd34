"""`bench bias`: is a gradient strategy's estimate biased, and how much variance does it add?

    python -m jagg_lab.bench bias out=FILE.json [n_rollouts=64] ["strategies=[jagg,jagg_cv]"] ...
    python -m jagg_lab.bench bias "strategies=[jagg_causal:4,subsample:4,jagg_causal:6,subsample:6]" ...

A strategy named `name:W` gets one row at window W; a bare name gets one per `windows` entry.
`window_detail=true` adds, for every window size of the `jagg` rows, one row per window position
(its noise levels, the routing score of `jagg_routed` from the rollout's velocities, and JAGG's
bias and error on that window's share of the loss) and the correlation over (rollout, window)
of the routing score with JAGG's relative error there: can routing find the windows where JAGG errs?
`name[:W]@PRECISION` runs that row's gradient phase in a `trainer.precision` (bf16-mixed: the
transformer under bfloat16 autocast, as training runs it) on the same float32 rollouts, against
float32 `full`; `full@bf16-mixed` is `full` itself in bfloat16.

In GRPO one rollout's gradient is roughly ten times larger than its mean over rollouts, so
a per-rollout cosine to `full` says little: what matters is whether an estimator's error
averages out. For each of N independent rollouts of the training setting (the training
config, composed as `python -m jagg_lab.train` composes it), every strategy's gradient g
and `full`'s f are computed on the same rollout, d = g - f, and the errors are summarised
over rollouts (`jagg_lab.strategies.bias`): z = |mean d|^2 / (tr Cov(d) / N) is about 1
without bias and grows with N when there is one; the mean errors of odd and even rollouts
point the same way when the error is systematic.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from jagg_lab import cli
from jagg_lab.bench.common import (
    PRECISIONS,
    check_device,
    command_line,
    gradient_phase,
    machine,
    precision_context,
    training_config,
    training_rollout,
    training_setting,
    write_json,
)
from jagg_lab.bench.report import markdown_table
from jagg_lab.module import GRPOModule
from jagg_lab.strategies import (
    FullStrategy,
    GradientStrategy,
    JaggCausalStrategy,
    JaggCVStrategy,
    JaggKnotsStrategy,
    JaggRoutedStrategy,
    JaggStrategy,
    SubsampleStrategy,
)
from jagg_lab.strategies.bias import ErrorSums, bias_summary
from jagg_lab.strategies.core import flat_grad, partition_windows
from jagg_lab.strategies.routed import window_scores

__all__ = ["BiasArgs", "ESTIMATORS", "bench_bias", "main"]

PROG = "python -m jagg_lab.bench bias"

# name -> (window, seed[, cos_threshold]) -> strategy; every estimator is compared with `full` on the same rollout
ESTIMATORS: dict[str, Callable[..., GradientStrategy]] = {
    "full": lambda w, seed: FullStrategy(),  # as an estimator: in another precision than the float32 reference
    "jagg": lambda w, seed: JaggStrategy(window=w, mode="cached"),
    "subsample": lambda w, seed: SubsampleStrategy(window=w, per_window=2, choice="random", seed=seed),
    "subsample3": lambda w, seed: SubsampleStrategy(window=w, per_window=3, choice="random", seed=seed),
    "jagg_cv": lambda w, seed: JaggCVStrategy(window=w, seed=seed),
    "jagg_cv_p50": lambda w, seed: JaggCVStrategy(window=w, correct_prob=0.5, seed=seed),
    "jagg_cv_bend": lambda w, seed: JaggCVStrategy(window=w, proposal="bend", seed=seed),
    "jagg_cv_k2": lambda w, seed: JaggCVStrategy(window=w, n_correct=2, seed=seed),
    "subsample4": lambda w, seed: SubsampleStrategy(window=w, per_window=4, choice="random", seed=seed),
    "jagg_knots": lambda w, seed: JaggKnotsStrategy(knot_spacing=w - 1),
    "jagg_routed": lambda w, seed, threshold=0.5: JaggRoutedStrategy(window=w, cos_threshold=threshold),
    # causal nodes: windows of W held from their first state, the last step exact (2 items per window)...
    "jagg_causal": lambda w, seed: JaggCausalStrategy(window=w),
    # ...without the exact last step (1 item per W steps)...
    "jagg_causal_open": lambda w, seed: JaggCausalStrategy(window=w, exact_end=False),
    # ...or knots every W - 1 steps and the last, shared by neighbouring segments, held or extrapolated
    "jagg_causal_knots": lambda w, seed: JaggCausalStrategy(window=None, knot_spacing=w - 1),
    "jagg_causal_extrap": lambda w, seed: JaggCausalStrategy(window=None, knot_spacing=w - 1, extrapolate=True),
}


def parse_entry(entry: str) -> tuple[str, int | None, str]:
    """`name`, `name:W`, each optionally `@PRECISION` -> (name, W or None, precision)."""
    spec, _, precision = entry.partition("@")
    precision = precision or "32-true"
    if precision not in PRECISIONS:
        raise ValueError(f"strategies: {entry!r} names precision {precision!r}; choose from {list(PRECISIONS)}")
    name, _, window = spec.partition(":")
    if name == "full":
        if window or precision == "32-true":
            raise ValueError(f"strategies: {entry!r}: full has no window, and in 32-true it is the reference itself; "
                             "use full@bf16-mixed")
        return name, 1, precision
    if not window:
        return name, None, precision
    if not window.isdigit() or int(window) < 2:
        raise ValueError(f"strategies: {entry!r} pins a window that is not an integer >= 2")
    return name, int(window), precision


# work counts a strategy reports, per rollout (jagg_frac: the routed share of approximated windows)
COUNTED = ("backward_passes", "backward_items", "nograd_forwards", "corrected_windows", "jagg_frac")


@dataclass
class BiasArgs:
    """Bias and added variance of gradient strategies against `full`, over independent rollouts
    of a training setting (see `python -m jagg_lab.bench bias`'s module docstring)."""

    out: str | None = None  # a new JSON file for the report (None: print only)
    experiment: str = "jagg_w4"  # the training setting the rollouts come from (+experiment=...)
    overrides: list[str] = field(default_factory=list)  # more training-config overrides, e.g. [sampler.noise_level=0.3]
    strategies: list[str] = field(default_factory=lambda: ["jagg", "subsample", "jagg_cv", "jagg_cv_p50"])
    windows: list[int] = field(default_factory=lambda: [4])  # W of every windowed estimator
    routed_thresholds: list[float] = field(default_factory=lambda: [0.5])  # jagg_routed: one row per cos_threshold
    n_rollouts: int = 64  # N independent rollouts (the prompt stream's first N batches)
    seed: int = 0  # training seed: prompt stream, rollout noise, the estimators' draws
    device: str = "cpu"
    window_detail: bool = False  # per window of the jagg rows: routing score, bias, error (costs a full and a jagg pass more)

    def __post_init__(self) -> None:
        unknown = [s for s in self.strategies if parse_entry(s)[0] not in ESTIMATORS]
        if not self.strategies or unknown:
            raise ValueError(f"strategies: unknown {unknown}; choose from {sorted(ESTIMATORS)}")
        if not self.windows or any(w < 2 for w in self.windows):
            raise ValueError(f"windows must all be >= 2, got {self.windows}")
        if not self.routed_thresholds or any(not -1 <= t <= 1 for t in self.routed_thresholds):
            raise ValueError(f"routed_thresholds must all be in [-1, 1], got {self.routed_thresholds}")
        if self.n_rollouts < 4:
            raise ValueError(f"n_rollouts must be >= 4 (odd and even halves), got {self.n_rollouts}")
        check_device(self.device)
        if self.out is not None and Path(self.out).exists():
            raise ValueError(f"out: {self.out} already exists; choose a new file")


def _setting(args: BiasArgs):
    """The training setting, composed and checked as `jagg_lab.train` does; a bad override
    raises ValueError naming it, before the policy is built."""
    cfg = training_config(args.experiment, args.seed, args.overrides)
    return (cfg, *training_setting(cfg, args.seed, args.device))


def _gradient(strategy: GradientStrategy, module: GRPOModule, rollout, advantages, device: str,
              index: int = 0) -> tuple[torch.Tensor, dict, float]:
    """The gradient a training step accumulates over its micro-batches (grpo.micro_batch_size)
    for rollout `index`, from zero; the strategy's stats; the seconds it took."""
    seconds, stats = gradient_phase(module, strategy, rollout, advantages, device,
                                    micro_batches=len(advantages) // module.grpo.micro_batch_size, index=index)
    grad = flat_grad(module.trainable_parameters()).detach().clone()
    module.policy.zero_grad(set_to_none=True)
    return grad, {key: stats[key] for key in COUNTED if key in stats}, seconds


def window_gradients(module: GRPOModule, rollout, advantages, window: int, micro_batches: int,
                     index: int = 0) -> list[dict]:
    """Per window of `window` trained steps: the routing score (`jagg_routed`'s, from the rollout's
    velocities, averaged over the batch), and JAGG's and full's gradients of that window's share of
    the step's loss (the windows' full gradients sum to the step's). Gradients are left zeroed."""
    steps = module.objective.loss.steps_of(rollout)
    total, params = rollout.final.shape[0], module.trainable_parameters()
    out = []
    for positions in partition_windows(len(steps), window):
        share = dataclasses.replace(module.objective.loss, trained_steps=tuple(steps[i] for i in positions))
        grads = []
        for strategy in (JaggStrategy(window=window, mode="cached"), FullStrategy()):
            module.policy.zero_grad(set_to_none=True)
            for idx in torch.arange(total, device=rollout.final.device).chunk(micro_batches):
                share.backward(strategy, module.policy, rollout, advantages, idx, on_policy=True, params=params,
                               scale=len(idx) / total * len(positions) / len(steps), draw=module.objective.block_generator(idx, index))
            grads.append(flat_grad(params).detach().clone())
        module.policy.zero_grad(set_to_none=True)
        velocities = [rollout.velocities[:, steps[i]] for i in positions]
        out.append({"steps": [steps[i] for i in positions], "g": grads[0], "f": grads[1],
                    "score": window_scores(velocities, list(range(len(positions)))).mean().item()})
    return out


def _rank(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for r, i in enumerate(order):
        ranks[i] = float(r)
    return ranks


def score_error_correlation(pairs: list[tuple[float, float]]) -> dict[str, float]:
    """Pearson and Spearman correlation of (routing score, relative error) over (rollout, window)
    pairs; a routing rule works where it is clearly negative (high score, small error)."""
    scores, errors = [p[0] for p in pairs], [p[1] for p in pairs]
    if len(pairs) < 3 or len(set(scores)) < 2 or len(set(errors)) < 2:
        return {"pairs": len(pairs), "pearson": float("nan"), "spearman": float("nan")}
    return {"pairs": len(pairs), "pearson": statistics.correlation(scores, errors),
            "spearman": statistics.correlation(_rank(scores), _rank(errors))}


def bench_bias(args: BiasArgs, progress: Callable[[str], None] = lambda line: None, setting=None,
               partial: Callable[[dict], None] | None = None) -> dict:
    """The report over `n_rollouts` rollouts; `partial(report)` receives the report so far after
    every rollout from the fourth on (its `rollouts_done` says how many it holds)."""
    cfg, module, data = setting or _setting(args)
    objective = module.objective
    # key: (strategy, window, cos_threshold, precision); the threshold only for jagg_routed's rows
    entries = [parse_entry(entry) for entry in args.strategies]
    keys = list(dict.fromkeys((name, w, t, precision) for name, pinned, precision in entries
                              for w in ([pinned] if pinned else args.windows)
                              for t in (args.routed_thresholds if name == "jagg_routed" else [None])))
    estimators = {(name, w, t, p): ESTIMATORS[name](w, args.seed) if t is None else ESTIMATORS[name](w, args.seed, t)
                  for name, w, t, p in keys}
    for estimator in estimators.values():  # drawn blocks (grpo.block_fraction < 1): windows must keep to them
        module.objective.loss.check_strategy(estimator)
    reference = ("full", 1, None, "32-true")
    sums = {key: ErrorSums() for key in estimators}
    detail_windows = sorted({key[1] for key in estimators if key[0] == "jagg"}) if args.window_detail else []
    window_sums: dict[tuple[int, int], ErrorSums] = {}
    window_seen: dict[tuple[int, int], dict] = {}
    pairs: dict[int, list[tuple[float, float]]] = {w: [] for w in detail_windows}
    work = {key: {} for key in [reference, *estimators]}
    seconds = {key: 0.0 for key in work}

    def count(key, stats, t):
        seconds[key] += t
        for name, value in stats.items():
            work[key][name] = work[key].get(name, 0) + value

    def report(done: int) -> dict:
        rows = [{"strategy": key[0], "window": key[1], **({"cos_threshold": key[2]} if key[2] is not None else {}),
                 "precision": key[3],
                 **{f"{name}_per_rollout": v / done for name, v in work[key].items()},
                 "gradient_s_per_rollout": seconds[key] / done, **(bias_summary(sums[key]) if key in sums else {})}
                for key in work]
        return {
            "command": command_line(args, PROG), "args": asdict(args),
            "setting": {"sampler": dict(cfg.sampler), "grpo_train_fraction": cfg.grpo.train_fraction,
                        "trained_steps": list(objective.trained_steps), "samples_per_rollout": data.samples_per_step,
                        "policy": dict(cfg.policy)},
            "machine": machine(args.device), "wall_s": time.perf_counter() - start,
            "rollouts_done": done, "no_bias_z": 1.0, "rows": rows,
            **({"windows": window_report(), "score_error_correlation": {
                str(w): score_error_correlation(pairs[w]) for w in detail_windows}} if detail_windows else {}),
        }

    def window_report() -> list[dict]:
        levels = module.sampler.noise_levels(module.policy).tolist()
        return [{"window": w, "position": i, "steps": seen["steps"], "noise_levels": [levels[seen["steps"][0]], levels[seen["steps"][-1]]],
                 "mean_score": seen["score"] / seen["n"], **bias_summary(window_sums[(w, i)])}
                for (w, i), seen in window_seen.items()]

    stream = iter(data.train_dataloader())
    start = time.perf_counter()
    for i in range(args.n_rollouts):
        rollout, advantages = training_rollout(module, data, next(stream), i, args.device)
        module.policy.train()
        f, stats, t = _gradient(FullStrategy(), module, rollout, advantages, args.device, i)
        count(reference, stats, t)
        for key, strategy in estimators.items():
            with precision_context(key[3], args.device):
                g, stats, t = _gradient(strategy, module, rollout, advantages, args.device, i)
            sums[key].add(g, f)
            count(key, stats, t)
        for w in detail_windows:
            for position, part in enumerate(window_gradients(module, rollout, advantages, w,
                                                             len(advantages) // module.grpo.micro_batch_size, i)):
                window_sums.setdefault((w, position), ErrorSums()).add(part["g"], part["f"])
                seen = window_seen.setdefault((w, position), {"steps": part["steps"], "score": 0.0, "n": 0})
                seen["score"] += part["score"]
                seen["n"] += 1
                f_norm = part["f"].norm().item()
                if f_norm > 0:
                    pairs[w].append((part["score"], (part["g"] - part["f"]).norm().item() / f_norm))
        progress(f"rollout {i + 1}/{args.n_rollouts}, {time.perf_counter() - start:.0f} s")
        if partial is not None and i + 1 >= 4 and i + 1 < args.n_rollouts:
            partial(report(i + 1))
    return report(args.n_rollouts)


COLUMNS = [("strategy", "strategy", "{}"), ("window", "W", "{}"), ("precision", "precision", "{}"), ("backward_items_per_rollout", "backward items", "{:.1f}"),
           ("cos_threshold", "routing threshold", "{}"), ("jagg_frac_per_rollout", "routed share", "{:.2f}"),
           ("per_rollout_cosine", "per-rollout cos(g, f)", "{:.3f}"), ("z", "z (no bias: ~1)", "{:.2f}"),
           ("halves_cosine", "cos(odd, even mean d)", "{:.2f}"), ("bias_over_mean_full", "|mean d| / |mean f|", "{:.2f}"),
           ("mean_cosine", "cos(mean g, mean f)", "{:.2f}"), ("rel_error", "per-rollout error / noise of f", "{:.2f}"),
           ("worst_over_mean", "worst / mean rollout error^2", "{:.1f}"), ("rollout_kurtosis", "error kurtosis over rollouts", "{:.1f}"),
           ("coord_kurtosis", "error kurtosis over parameters", "{:.0f}")]


WINDOW_COLUMNS = [("window", "W", "{}"), ("position", "window", "{}"), ("steps", "steps", "{}"),
                  ("mean_score", "routing score", "{:.3f}"), ("z", "z (no bias: ~1)", "{:.2f}"),
                  ("halves_cosine", "cos(odd, even mean d)", "{:.2f}"), ("bias_over_mean_full", "|mean d| / |mean f|", "{:.2f}"),
                  ("rel_error", "per-rollout error / noise of f", "{:.2f}")]


def table(report: dict) -> str:
    return markdown_table(report["rows"], COLUMNS)


def _main(args: BiasArgs) -> int:
    try:
        setting = _setting(args)
    except ValueError as err:
        sys.stderr.write(f"bias: {err}\n")
        return 2
    for name, pinned, _ in map(parse_entry, args.strategies):  # drawn blocks: every window must keep to them
        for w in [pinned] if pinned else args.windows:
            try:
                setting[1].objective.loss.check_strategy(ESTIMATORS[name](w, args.seed))
            except ValueError as err:
                sys.stderr.write(f"bias: {name}:{w}: {err}\n")
                return 2
    report = bench_bias(args, progress=lambda line: sys.stderr.write(line + "\n"), setting=setting,
                        partial=(lambda r: write_json(r, args.out)) if args.out else None)
    if args.out:
        write_json(report, args.out)
    z_full = report["rows"][1]["z_full"] if len(report["rows"]) > 1 else float("nan")
    sys.stdout.write(f"{args.n_rollouts} rollouts in {report['wall_s']:.0f} s; z of the mean full gradient itself: {z_full:.2f}\n")
    sys.stdout.write(table(report) + "\n")
    if "windows" in report:
        sys.stdout.write("\nJAGG per window (window_detail):\n" + markdown_table(report["windows"], WINDOW_COLUMNS) + "\n")
        for w, corr in report["score_error_correlation"].items():
            sys.stdout.write(f"W = {w}: routing score against JAGG's relative error over {corr['pairs']} (rollout, window) "
                             f"pairs: Pearson {corr['pearson']:+.2f}, Spearman {corr['spearman']:+.2f}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli.run(_main, BiasArgs, PROG, argv)
