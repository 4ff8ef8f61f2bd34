"""Which gradient strategy should a user pick? Each arm's held-out gain over the base, over its
training seeds (mean and seed-to-seed std), at equal optimizer steps, equal backward items and
equal gradient-phase time.

    python experiments/strategy_choice.py base=BASE.json \
        "finals=[full=DIR/full_seed*.json,jagg_cv_w6=DIR/jagg_cv_w6_seed*/eval.json]" \
        "gains=[DIR/full/gain.json,DIR/jagg_cv_w6/gain.json]" "items=[full=12]" \
        curve_base=DIR/base_curve.json timing=ARMS.json out=DIR

finals: NAME=GLOB, the final policies of an arm (one per seed; an arm named twice gathers both
globs' files) scored by `jagg_lab.evaluate` on
the same samples as `base` (the verdict set, e.g. n = 2048): paired gains per seed, then their
mean and std over seeds, and how far the mean lies from the reference arm's in units of the
reference's seed std. gains: `experiments/default_gain.py` outputs whose scored checkpoints give
the curve (gain against steps and cumulative backward items, on their own evaluation set) and,
where recorded, each arm's backward items per optimizer step (read first from a `metrics.csv`
next to a final evaluation, as a training run writes it); `items` gives them for arms whose runs
recorded neither. curve_base: the base's evaluation on the curve set; each final whose run
directory keeps `eval_curve.json` (its final policy on that set, as default_gain leaves it) adds
that point to the curve, so runs made one seed at a time count once each. timing: a
`python -m jagg_lab.bench arms` report that timed the arms' gradient phases side by side (its
experiments named as the arms): each arm's gradient-phase seconds per optimizer step (its runs'
backward items per step at the timed seconds per item, so a drawing strategy is charged for the
draws its runs made, not those of the timed rounds), the curve's time axis, and the equal-time
comparison: each arm's last curve point against the reference's curve at the same cumulative
gradient-phase seconds (interpolated linearly in steps between its scored points, through the
base at step 0). timing_more: further `bench arms` reports for arms `timing` did not time, each
of which timed the reference too: an arm's seconds there are its ratio to that report's reference,
times the reference's seconds in `timing`. clock=step: the same with whole-step seconds (rollout,
reward and gradient phase) from `python -m jagg_lab.bench step` reports (each experiment's row of
the SDE rollout, or of its own rollout for a forward-process objective or a moving window): the
clock for arms whose rollouts or objectives differ, such as AWM beside `full`. An arm whose last
curve point took longer than the reference's last is read the other way round: its curve at the
reference's last point's seconds. Writes `OUT/choice.{json,md}` and
`OUT/gain_vs_cost.png` (the curves); OUT is never overwritten. category: every comparison on the
verdict set's samples of that shapes category only (e.g. counting, where GRPO's gain concentrates);
the curves, measured on every category, are then left out.
"""
from __future__ import annotations

import glob
import inspect
import json
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from jagg_lab import cli  # noqa: E402
from jagg_lab.evaluation import eval_categories, paired_gain  # noqa: E402
from jagg_lab.evaluation.arms import gradient_phase, load_evaluation, mean_std, named_pairs  # noqa: E402
from jagg_lab.renamed import RENAMED_KEYS  # noqa: E402
from hydra.utils import get_class  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402


@dataclass
class Args:
    base: str = "???"  # the base policy's evaluation on the verdict set
    finals: list[str] = field(default_factory=list)  # NAME=GLOB: an arm's final-policy evaluations, one per seed
    gains: list[str] = field(default_factory=list)  # default_gain.py gain.json files: curves, items per step
    items: list[str] = field(default_factory=list)  # NAME=N backward items per optimizer step, where gains lack them
    timing: str | None = None  # a `bench arms` report: gradient-phase seconds per step of each arm, timed side by side
    timing_more: list[str] = field(default_factory=list)  # further `bench arms` reports, for arms `timing` did not time
    clock: str = "gradient"  # gradient: bench arms reports, gradient-phase seconds; step: bench step reports, whole steps
    curve_base: str | None = None  # the base on the curve set: each final's eval_curve.json (next to it) becomes a curve point
    reference: str = "full"  # the arm the others are measured against
    category: str | None = None  # compare on the verdict set's samples of this shapes category only (no curves)
    out: str = "outputs/choice"  # never overwritten

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {self.clock!r}")


# clock -> (the report that times it, the key of its seconds in the outputs, what it measures)
CLOCKS = {"gradient": ("bench arms", "gradient_s", "gradient-phase"), "step": ("bench step", "step_s", "whole-step")}


def choose(args: Args) -> None:
    out = Path(args.out)
    finals: dict[str, list[str]] = {}  # an arm named twice gathers the runs of both patterns
    for name, pattern in named_pairs(args.finals, "finals"):
        finals.setdefault(name, []).append(pattern)
    items = {k: float(v) for k, v in named_pairs(args.items, "items")}
    if args.reference not in finals:
        raise ValueError(f"reference: {args.reference!r} is not one of the finals {sorted(finals)}")
    files = {name: sorted({p for pattern in patterns for p in glob.glob(pattern)}) for name, patterns in finals.items()}
    empty = [f"{name}={pattern}" for name, patterns in finals.items() for pattern in patterns if not glob.glob(pattern)]
    if empty:
        raise FileNotFoundError(f"finals: nothing matches {empty}")
    if out.exists():
        raise FileExistsError(f"out: {out} exists; choose a new directory")
    load = partial(_load, category=args.category)
    base = load(args.base, verdict=False)
    curve_base = None
    if args.curve_base is not None and args.category is None:  # the curves are of every category: left out
        if not Path(args.curve_base).is_file():
            raise FileNotFoundError(f"curve_base: no such file {args.curve_base}")
        curve_base = json.loads(Path(args.curve_base).read_text())
    per_item = _timing(args.timing, files, args.reference, args.clock)
    unit, unit_words = CLOCKS[args.clock][1:]
    timed_in = {name: args.timing for name in per_item}
    for path in args.timing_more:  # an arm's ratio to the reference, timed side by side there, at timing's reference seconds
        if args.timing is None:
            raise ValueError("timing_more: give the first report as timing=")
        try:
            more = _timing(path, files, args.reference, args.clock)
        except (OSError, ValueError) as err:
            raise ValueError(f"timing_more: {err}") from None
        first, other = (json.loads(Path(p).read_text())["setting"] for p in (args.timing, path))
        keys = [f"{group}.{k}" for group in sorted(first.keys() | other.keys())
                for k in _differing(_current(group, first.get(group, {})), _current(group, other.get(group, {})))]
        if keys:
            raise ValueError(f"timing_more: {path} timed other settings than {args.timing}: {keys}")
        scale = per_item[args.reference][1] / more[args.reference][1]
        for name, timed in more.items():
            if name not in per_item:
                per_item[name] = tuple(t * scale for t in timed)
                timed_in[name] = path
    gain_files = [json.loads(Path(p).read_text()) for p in args.gains]
    for name, paths in files.items():  # items per step from the runs' own metrics.csv, next to their evaluations
        recorded = [gradient_phase(Path(p).parent)["backward_items"] for p in paths if (Path(p).parent / "metrics.csv").is_file()]
        if recorded:
            items.setdefault(name, statistics.fmean(recorded))
    for result in gain_files:  # or as default_gain recorded them
        for row in result["runs"]:
            if "backward_items" in row:
                items.setdefault(row["arm"], row["backward_items"])
    # an arm's seconds per step: its runs' backward items per step at the seconds per item timed side by side
    # (a drawing strategy's timed rounds hold fewer draws than its runs; without recorded items, the timed step),
    # plus, on the step clock, its rollout and reward
    seconds = {name: per_item[name][0] * items[name] + per_item[name][2] if name in items else per_item[name][1]
               for name in per_item}
    arms = []
    for name, paths in files.items():
        runs = [{"evaluation": p, **{k: v for k, v in paired_gain(load(p), base).items()
                                      if k != "per_category"}} for p in paths]
        (sm, ss), (dm, ds) = mean_std([r["strict_gain"] for r in runs]), mean_std([r["dense_gain"] for r in runs])
        arms.append({"arm": name, "seeds": len(runs), "items_per_step": items.get(name),
                     f"{unit}_per_step": seconds.get(name), "timed_in": timed_in.get(name), "strict_gain_mean": sm,
                     "strict_gain_std": ss, "dense_gain_mean": dm, "dense_gain_std": ds, "runs": runs})
    ref = next(a for a in arms if a["arm"] == args.reference)
    for arm in arms:
        arm["items_vs_reference"] = (arm["items_per_step"] / ref["items_per_step"]
                                     if arm["items_per_step"] and ref["items_per_step"] else None)
        arm["time_vs_reference"] = (arm[f"{unit}_per_step"] / ref[f"{unit}_per_step"]
                                    if arm[f"{unit}_per_step"] and ref[f"{unit}_per_step"] else None)
        for metric in ("strict", "dense"):  # distance to the reference's mean in its seed std
            std = ref[f"{metric}_gain_std"]
            arm[f"{metric}_vs_reference_in_std"] = (arm[f"{metric}_gain_mean"] - ref[f"{metric}_gain_mean"]) / std if std > 0 else float("nan")

    paired = _paired_arms(files, args.reference, load)

    curve: dict[tuple[str, int], dict] = {}  # (arm, steps) -> {seed: scored point}; a point found twice counts once
    for result in gain_files if args.category is None else []:
        for row in result["checkpoints"]:
            curve.setdefault((row["arm"], row["steps"]), {})[row["seed"]] = row
    for (name, steps, seed), row in _run_curve_points(files, curve_base).items():
        curve.setdefault((name, steps), {})[seed] = row
    curve_rows = []
    for (name, steps), by_seed in sorted(curve.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        rows = list(by_seed.values())
        (sm, ss), (dm, ds) = mean_std([r["strict_gain"] for r in rows]), mean_std([r["dense_gain"] for r in rows])
        per_step = items.get(name)
        curve_rows.append({"arm": name, "steps": steps, "seeds": len(rows), "items": per_step * steps if per_step else None,
                           unit: seconds[name] * steps if name in seconds else None,
                           "strict_gain_mean": sm, "strict_gain_std": ss, "dense_gain_mean": dm, "dense_gain_std": ds})
    equal_time = _equal_time(curve_rows, seconds, args.reference, unit)

    n_final = base.get("n_samples")
    n_curve = {r["args"].get("curve_n_eval") or r["args"]["n_eval"] for r in gain_files} | (
        {curve_base["n_samples"]} if curve_base else set())
    lines = [f"Final policies on the verdict set (n = {n_final}{f', its {args.category} samples' if args.category else ''}), gain over the base: mean +- std over training seeds; "
             f"'vs {args.reference}' = (mean - {args.reference}'s mean) / {args.reference}'s seed std", "",
             "| arm | seeds | backward items / step | x " + args.reference + f" | {unit.replace('_', ' ')} / step | x " + args.reference
             + " | strict gain | vs " + args.reference + " | dense gain | vs " + args.reference + " |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {a['arm']} | {a['seeds']} | {_num(a['items_per_step'])} | {_num(a['items_vs_reference'], '.2f')} "
              f"| {_num(a[f'{unit}_per_step'], '.2f')} | {_num(a['time_vs_reference'], '.2f')} "
              f"| {a['strict_gain_mean']:+.3f} +- {a['strict_gain_std']:.3f} | {a['strict_vs_reference_in_std']:+.1f} "
              f"| {a['dense_gain_mean']:+.3f} +- {a['dense_gain_std']:.3f} | {a['dense_vs_reference_in_std']:+.1f} |" for a in arms]
    lines += ["", f"Paired per-sample test against {args.reference} on the verdict set: each arm's per-sample scores "
              f"averaged over its seeds minus {args.reference}'s, mean +- standard error over the samples (z = mean / se)",
              "", f"| arm | strict vs {args.reference} | z | dense vs {args.reference} | z |", "|---|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['strict_gain']:+.3f} +- {r['strict_gain_se']:.3f} | {_z(r, 'strict')} "
              f"| {r['dense_gain']:+.3f} +- {r['dense_gain_se']:.3f} | {_z(r, 'dense')} |" for r in paired]
    lines += [] if args.category else ["", f"Curves (scored checkpoints and final policies, n = {', '.join(str(n) for n in sorted(n_curve))}): "
              f"gain against optimizer steps, cumulative backward items and cumulative {unit_words} seconds", "",
              f"| arm | steps | backward items | {unit.replace('_', ' ')} | seeds | strict gain | dense gain |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['steps']} | {_num(r['items'])} | {_num(r[unit], '.0f')} | {r['seeds']} "
              f"| {r['strict_gain_mean']:+.3f} +- {r['strict_gain_std']:.3f} "
              f"| {r['dense_gain_mean']:+.3f} +- {r['dense_gain_std']:.3f} |" for r in curve_rows]
    if equal_time:
        lines += ["", f"Equal {unit_words} time (curve set): each arm's last curve point against {args.reference}'s curve "
                  f"at the same cumulative seconds ({args.reference}'s steps interpolated linearly between its scored "
                  "points, through the base at step 0; mean and std over seeds interpolated alike); an arm whose last point "
                  f"took longer than {args.reference}'s last: its own curve at that point's seconds", "",
                  f"| arm | seeds | steps | {unit.replace('_', ' ')} | {args.reference} steps in that time | strict gain | {args.reference} strict gain "
                  f"| difference | dense gain | {args.reference} dense gain | difference |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['arm']} | {r['seeds']} | {r['steps']:.3g} | {r[unit]:.0f} | {r['reference_steps']:.1f} | "
                  + " | ".join(f"{r[f'{m}_gain_mean']:+.3f} +- {r[f'{m}_gain_std']:.3f} | {_gain(r, f'reference_{m}')} | "
                               + ("-" if r[f"reference_{m}_gain_mean"] is None
                                  else f"{r[f'{m}_gain_mean'] - r[f'reference_{m}_gain_mean']:+.3f}") for m in ("strict", "dense"))
                  + " |" for r in equal_time]
    for path in args.timing_more:
        scaled = [a["arm"] for a in arms if a["timed_in"] == path]
        if scaled:
            lines += ["", f"Timed in {path}, beside {args.reference} (seconds: their ratio to {args.reference} there, "
                          f"times {args.reference}'s seconds in {args.timing}): {', '.join(scaled)}"]
    untimed = [a["arm"] for a in arms if seconds and a[f"{unit}_per_step"] is None]
    if untimed:
        lines += ["", f"Not in the timing report (no seconds): {', '.join(untimed)}"]
    out.mkdir(parents=True, exist_ok=False)  # everything is read and checked: now write, the JSON last
    _plot_curves(curve_rows, out / "gain_vs_cost.png", unit, unit_words)
    (out / "choice.md").write_text("\n".join(lines) + "\n")
    (out / "choice.json").write_text(json.dumps({"args": vars(args), "arms": arms, "paired": paired, "curve": curve_rows,
                                                 "equal_time": equal_time}, indent=2) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")


def _load(path: str, category: str | None = None, verdict: bool = True) -> dict:
    """An evaluation (`paired.load`: verdict, whether a run's heldout_final.json may stand for
    one); with `category`, only its samples of that category (the prompts' categories follow
    `eval_categories`), its scores recomputed on them."""
    result = load_evaluation(path, verdict=verdict)
    if category is None:
        return result
    args = result.get("args", {})
    labels = eval_categories(len(result["per_sample"]["strict"]), args.get("categories"))
    keep = [i for i, label in enumerate(labels) if label == category]
    if not keep:
        raise ValueError(f"category: {path} holds no {category!r} samples")
    per_sample = {key: [result["per_sample"][key][i] for i in keep] for key in ("strict", "dense")}
    return {**result, "args": {**args, "categories": [category]}, "n_samples": len(keep),
            "strict_accuracy": statistics.fmean(per_sample["strict"]), "dense_score": statistics.fmean(per_sample["dense"]),
            "per_sample": per_sample}


def _seed_mean(paths: list[str], load=_load) -> dict:
    """An arm's evaluations as one: per-sample scores averaged over its seeds (same samples)."""
    results = [load(p) for p in paths]
    per_sample = {key: [statistics.fmean(scores) for scores in zip(*(r["per_sample"][key] for r in results), strict=True)]
                  for key in ("strict", "dense")}
    return {"args": results[0].get("args", {}), "strict_accuracy": statistics.fmean(per_sample["strict"]),
            "dense_score": statistics.fmean(per_sample["dense"]), "per_sample": per_sample}


def _paired_arms(files: dict[str, list[str]], reference: str, load=_load) -> list[dict]:
    """Each arm against the reference sample by sample (both averaged over their seeds): the
    paired test that the seed-std distance alone cannot give."""
    ref = _seed_mean(files[reference], load)
    return [{"arm": name, **{k: v for k, v in paired_gain(_seed_mean(paths, load), ref).items() if k != "per_category"}}
            for name, paths in files.items() if name != reference]


def _z(row: dict, metric: str) -> str:
    se = row[f"{metric}_gain_se"]
    return f"{row[f'{metric}_gain'] / se:+.1f}" if se > 0 else "-"


def _plot_curves(curve_rows: list[dict], path: Path, unit: str, unit_words: str) -> None:
    """Strict gain (mean +- std over seeds, from the base at 0) against cumulative backward items
    and, where timed, the clock's seconds: one line per arm."""
    axes_keys = [key for key in ("items", unit) if any(r[key] is not None for r in curve_rows)]
    if not axes_keys:
        return
    fig, axes = plt.subplots(1, len(axes_keys), figsize=(6 * len(axes_keys), 4), squeeze=False)
    for ax, key in zip(axes[0], axes_keys):
        for name in dict.fromkeys(r["arm"] for r in curve_rows):
            rows = [r for r in curve_rows if r["arm"] == name and r[key] is not None]
            if not rows:
                continue
            x = [0.0] + [r[key] for r in rows]
            mean = [0.0] + [r["strict_gain_mean"] for r in rows]
            std = [0.0] + [r["strict_gain_std"] if r["seeds"] > 1 else 0.0 for r in rows]
            line, = ax.plot(x, mean, marker="o", label=f"{name} ({max(r['seeds'] for r in rows)} seeds)")
            ax.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=line.get_color(), alpha=0.15)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel({"items": "cumulative backward items", unit: f"cumulative {unit_words} seconds"}[key])
        ax.set_ylabel("held-out strict gain over the base")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _timing(path: str | None, files: dict[str, list[str]], reference: str,
            clock: str = "gradient") -> dict[str, tuple[float, float, float]]:
    """{arm: (gradient-phase seconds per backward item, the clock's seconds per optimizer step,
    the step's seconds outside the gradient phase)} from a `bench arms` report (clock=gradient:
    nothing outside) or a `bench step` report (clock=step: rollout and reward; each experiment's
    row of the SDE rollout or of its own), refused unless it timed the reference and the sampler,
    GRPO and data settings of every run that kept its config (a moving window's keys are the
    experiment's own)."""
    if path is None:
        return {}
    if not Path(path).is_file():
        raise FileNotFoundError(f"timing: no such file {path}")
    report = json.loads(Path(path).read_text())
    command = "bench step" if report["rows"] and "step_s" in report["rows"][0] else "bench arms"
    if command != CLOCKS[clock][0]:
        raise ValueError(f"timing: {path} is a `{command}` report; clock={clock} reads `{CLOCKS[clock][0]}` reports")
    if clock == "gradient":
        seconds = {row["experiment"]: (row["gradient_s"] / row["backward_items"], row["gradient_s"], 0.0) for row in report["rows"]}
    else:
        rows = [row for row in report["rows"] if row["rollout"] in ("sde", "own") and not row.get("compile")]
        twice = sorted(name for name, n in Counter(row["experiment"] for row in rows).items() if n > 1)
        if twice:
            raise ValueError(f"timing: {path} timed {twice} in several precisions; give a report of one")
        seconds = {row["experiment"]: (row["gradient_s"] / row["backward_items"], row["step_s"],
                                       row["rollout_s"] + row["reward_s"]) for row in rows}
    if reference not in seconds:
        raise ValueError(f"timing: {path} did not time the reference {reference!r} (it timed {sorted(seconds)})")
    for paths in files.values():
        for final in paths:
            config = Path(final).parent / "config.yaml"
            if not config.is_file():
                continue
            run = OmegaConf.to_container(OmegaConf.load(config))
            for group in ("sampler", "grpo", "data"):  # data.seed is the run's own seed
                timed, trained = ({k: v for k, v in _current(group, d.get(group, {})).items() if k != "seed" and not k.startswith("sde_window")}
                                  for d in (report["setting"], run))
                keys = _differing(timed, trained)
                if keys:
                    raise ValueError(f"timing: {path} timed other {group} settings than {config} trained with: {keys}")
    return seconds


def _current(group: str, setting: dict) -> dict:
    """A config group's setting under today's key names (a file written before a rename, RENAMED_KEYS)."""
    names = {old.partition(".")[2]: new.partition(".")[2] for old, new in RENAMED_KEYS.items() if old.startswith(f"{group}.")}
    return {names.get(k, k): v for k, v in setting.items()}


def _differing(a: dict, b: dict) -> list[str]:
    """The keys of two settings of one config group whose values differ. A key one side lacks counts
    as its constructor's default (the group's _target_): a file written before the key existed ran
    without it, as that default does."""
    target = a.get("_target_") or b.get("_target_")
    return sorted(k for k in a.keys() | b.keys() if a.get(k, _default(target, k)) != b.get(k, _default(target, k)))


def _default(target: str | None, key: str):
    """The default of `key` in the constructor `target` names (a config's _target_), or None."""
    try:
        parameter = inspect.signature(get_class(target)).parameters.get(key) if target else None
    except (ImportError, ValueError, TypeError):
        return None
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _run_curve_points(files: dict[str, list[str]], curve_base: dict | None) -> dict[tuple[str, int, int], dict]:
    """(arm, steps, seed) -> the gain of a final policy on the curve set, for every final whose run
    directory keeps its curve-set evaluation (eval_curve.json), config.yaml (the seed) and metrics.csv
    (the steps), as `default_gain.py` leaves them; ValueError if it scored other samples than curve_base."""
    points = {}
    if curve_base is None:
        return points
    for name, paths in files.items():
        for path in paths:
            run_dir = Path(path).parent
            if all((run_dir / f).is_file() for f in ("eval_curve.json", "config.yaml", "metrics.csv")):
                seed, steps = OmegaConf.load(run_dir / "config.yaml").seed, gradient_phase(run_dir)["steps"]
                try:
                    gain = paired_gain(json.loads((run_dir / "eval_curve.json").read_text()), curve_base)
                except ValueError as err:
                    raise ValueError(f"curve_base: {run_dir / 'eval_curve.json'}: {err}") from None
                points[name, steps, seed] = {"arm": name, "seed": seed, "steps": steps, **gain}
    return points


def _equal_time(curve_rows: list[dict], seconds: dict[str, float], reference: str, unit: str = "gradient_s") -> list[dict]:
    """Each timed arm's last curve point next to the reference's curve at the same cumulative
    seconds (`unit`: the clock's key); an arm whose last point took longer than the reference's
    last: the arm's curve at that point's seconds instead (`at`: whose end is compared). Curves are
    interpolated linearly in steps through the base at step 0 (no gain, no spread)."""
    keys = ("strict_gain_mean", "strict_gain_std", "dense_gain_mean", "dense_gain_std")
    curves: dict[str, list[dict]] = {}
    for row in curve_rows:  # sorted by arm and steps: an arm's last row is its last point
        if row["arm"] in seconds:
            curves.setdefault(row["arm"], []).append(row)
    if reference not in curves:
        return []

    def read(curve: list[dict], steps: float) -> dict:
        return {k: float(np.interp(steps, [0] + [r["steps"] for r in curve], [0.0] + [r[k] for r in curve])) for k in keys}

    ref_end = curves[reference][-1]
    rows = []
    for name, curve in curves.items():
        end = curve[-1]
        if name == reference:
            continue
        if end[unit] <= ref_end[unit]:  # the arm's end against the reference's curve at its seconds
            row = {"at": "arm", "steps": end["steps"], unit: end[unit], "reference_steps": end[unit] / seconds[reference],
                   "seeds": end["seeds"], **{k: end[k] for k in keys}}
            row.update({f"reference_{k}": v for k, v in read(curves[reference], row["reference_steps"]).items()})
        else:  # the reference's end against the arm's curve at its seconds
            steps = ref_end[unit] / seconds[name]
            row = {"at": reference, "steps": steps, unit: ref_end[unit], "reference_steps": ref_end["steps"],
                   "seeds": min(r["seeds"] for r in curve if r["steps"] >= steps), **read(curve, steps),
                   **{f"reference_{k}": ref_end[k] for k in keys}}
        rows.append({"arm": name, **row})
    return rows


def _gain(row: dict, prefix: str) -> str:
    mean = row[f"{prefix}_gain_mean"]
    return "-" if mean is None else f"{mean:+.3f} +- {row[f'{prefix}_gain_std']:.3f}"


def _num(value: float | None, spec: str = "g") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    return cli.run(choose, Args, "python experiments/strategy_choice.py", argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
