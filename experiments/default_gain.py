"""Does the default experiment improve the base policy within a CPU budget?

    python experiments/default_gain.py "experiments=[jagg_w4]" "seeds=[0,1,2]" n_eval=512 out=outputs/gain

For each experiment x seed: train `python -m jagg_lab.train +experiment=E seed=S`, as a user
runs it (its own `trainer.max_steps` unless `max_steps` is given), stopped after at most
`minutes` of wall time, then score the trained policy and every periodic checkpoint with
`python -m jagg_lab.evaluate` (ODE, held-out prompts, the same prompts and noise for every
policy) next to the shipped base policy. With `control=true` the first experiment is also
trained with `grpo.shuffle_advantages=true` (same costs, advantages cut from their samples):
a gain should beat that control, not just the base (the difference is tabulated at every
seed and step both runs were scored at). Because every policy is scored on the
same prompts and noise, each gain comes with the standard error of the paired per-sample
difference. Writes `OUT/gain.json` and a Markdown table `OUT/gain.md` (per run, per
checkpoint, then mean +- std per arm).

A comparison cut short (a reboot, a job's time limit) goes on with the same command plus
`resume=true`: a run that reached its step cap or ended on its own is kept, one a signal or a
kill stopped is resumed from its newest `checkpoints/last.ckpt` into `RUN_DIR_resumed1` (then
`_resumed2`, ...; resumption is exact, and the `minutes` budget carries over in the
checkpoint), and an evaluation already written with the same checkpoint, samples and sampler
settings is reused. A run's metrics are its parts' rows, each cut where the next part begins.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from jagg_lab import cli
from jagg_lab.checkpointing import load_checkpoint
from jagg_lab.evaluate import EvalArgs
from jagg_lab.evaluation import paired_gain
from jagg_lab.evaluation.arms import gradient_phase, run_metrics, run_parts  # noqa: F401  (run_metrics: tests read it here)
from jagg_lab.rundir import run_summary, unfinished_run


@dataclass
class Args:
    experiments: list[str] = field(default_factory=lambda: ["jagg_w4", "full"])
    seeds: list[int] = field(default_factory=lambda: [0])
    control: bool = True  # also train the first experiment with shuffled advantages
    minutes: float = 15.0  # wall-clock cap per training run
    max_steps: int | None = None  # null: the experiment's own trainer.max_steps
    n_eval: int = 512  # held-out evaluation samples per policy
    eval_seed: int = 1
    out: str = "outputs/gain"  # never overwritten
    overrides: list[str] = field(default_factory=list)  # extra training overrides, e.g. ["optimizer.lr=1e-4"]
    base_eval: str | None = None  # an earlier evaluation of the shipped base on the same n_eval / eval_seed, reused
    curve_n_eval: int = 0  # > 0: periodic checkpoints and final policies scored on this (smaller) set for the curves
    curve_eval_seed: int = 1
    curve_base_eval: str | None = None  # an earlier evaluation of the shipped base on curve_n_eval / curve_eval_seed, reused
    resume: bool = False  # go on with the comparison in `out` (same settings): finished runs kept, cut ones resumed


def run(cmd: list[str]) -> None:
    subprocess.run([sys.executable, *cmd], check=True)


def evaluate(out_json: Path, checkpoint: str, n: int, seed: int) -> dict:
    """`jagg_lab.evaluate` of `checkpoint` into `out_json`, or what that file already holds for
    the same checkpoint, samples and sampler settings (a resumed comparison's earlier work)."""
    settings = asdict(EvalArgs(source="policy", n_samples=n, seed=seed, checkpoint=checkpoint))
    try:
        done = json.loads(out_json.read_text())
        if all(done["args"].get(k) == v for k, v in settings.items() if k != "out"):  # also the sampler's defaults
            return done
    except (OSError, ValueError, KeyError, AttributeError):  # absent, or cut short mid-write
        pass
    run(["-m", "jagg_lab.evaluate", "source=policy", f"n_samples={n}", f"seed={seed}",
         f"checkpoint={checkpoint}", f"out={out_json}"])
    return json.loads(out_json.read_text())


# a reusable base evaluation -> the keys of the samples it must have scored
REUSED_BASES = {"base_eval": ("n_eval", "eval_seed"), "curve_base_eval": ("curve_n_eval", "curve_eval_seed")}


def reused_base(args: Args, key: str = "base_eval") -> dict:
    """The shipped base's evaluation from `base_eval` (or `curve_base_eval`), refused unless it
    scored the same samples (`REUSED_BASES`)."""
    path = Path(getattr(args, key))
    n_key, seed_key = REUSED_BASES[key]
    n, seed = getattr(args, n_key), getattr(args, seed_key)
    if not path.is_file():
        raise SystemExit(f"{key}: no such file {path}")
    base = json.loads(path.read_text())
    got = {k: base.get("args", {}).get(k) for k in ("checkpoint", "n_samples", "seed")}
    if got != {"checkpoint": "shipped", "n_samples": n, "seed": seed}:
        raise SystemExit(f"{key}: {path} scored {got}, not the shipped base on {n_key}={n}, {seed_key}={seed}")
    return base


def arms(args: Args) -> list[tuple[str, str, list[str]]]:
    """(arm name, experiment, extra overrides) for every arm to train."""
    out = [(e, e, []) for e in args.experiments]
    if args.control:
        out.append((f"{args.experiments[0]}+shuffled", args.experiments[0], ["grpo.shuffle_advantages=true"]))
    return out


def train(args: Args, run_dir: Path, command: list[str], budget_s: float) -> list[Path]:
    """Train one run (`command`: `jagg_lab.train` and its overrides, without the run directory)
    into `run_dir`, or, resuming, go on with what is there. The run's parts, in order."""
    parts = run_parts(run_dir)
    if not run_dir.exists():
        if len(parts) > 1:
            raise SystemExit(f"resume: {parts[1]} continues a run that is not there ({run_dir}); move it away")
        run([*command, f"hydra.run.dir={run_dir}"])
        return [run_dir]
    summary = run_summary(parts[-1])  # None: killed
    if summary is not None and (summary.get("interrupted") is None or "unfinished" in summary):
        print(f"resume: keeping {parts[-1]}: it " + ("finished" if summary.get("interrupted") is None
                                                    else "was stopped after its last step"), flush=True)
        return parts
    resumable = [part for part in parts if (part / "checkpoints" / "last.ckpt").is_file()]
    if not resumable:
        raise SystemExit(f"resume: {run_dir} was cut before it wrote checkpoints/last.ckpt; move it away to train it again")
    checkpoint = resumable[-1] / "checkpoints" / "last.ckpt"
    state = load_checkpoint(checkpoint, "resume")
    step = state.get("global_step", 0)
    elapsed = state.get("callbacks", {}).get("Timer", {}).get("time_elapsed", {}).get("train", 0.0)
    cap = args.max_steps if args.max_steps is not None else OmegaConf.load(resumable[-1] / "config.yaml").trainer.max_steps
    if 0 < cap <= step or elapsed >= budget_s:  # cut after its last step: nothing left to train
        print(f"resume: keeping {run_dir}: {checkpoint} is at step {step} of {cap}, {elapsed:.0f} s of {budget_s:.0f}", flush=True)
        return parts
    part = run_dir.with_name(f"{run_dir.name}_resumed{len(parts)}")
    print(f"resume: {parts[-1]} {unfinished_run(parts[-1])}; resuming from {checkpoint} (step {step}) into {part}", flush=True)
    run([*command, f"resume={checkpoint}", f"hydra.run.dir={part}"])
    return [*parts, part]


def final_policy(parts: list[Path]) -> Path:
    """The weights of a run's last step: its last part's export, or, for a part killed before it
    exported them, the newest last.ckpt."""
    if (parts[-1] / "policy.safetensors").is_file():
        return parts[-1] / "policy.safetensors"
    return next(p / "checkpoints" / "last.ckpt" for p in reversed(parts) if (p / "checkpoints" / "last.ckpt").is_file())


def _settings(args: Args) -> dict:
    """What a comparison's results depend on: every argument but `resume`."""
    return {k: v for k, v in OmegaConf.to_container(OmegaConf.structured(args)).items() if k != "resume"}


def _start(out: Path, args: Args) -> None:
    """Make `out` for a new comparison, or check the one a resume goes on with (same settings;
    with none there yet, a resume starts it)."""
    record = out / "args.json"
    if not args.resume or not out.exists():
        out.mkdir(parents=True, exist_ok=False)  # never overwrite an earlier comparison
        record.write_text(json.dumps(_settings(args), indent=2) + "\n")
        return
    if (out / "gain.json").exists():
        raise SystemExit(f"resume: {out} is a finished comparison (gain.json); nothing to go on with")
    if not record.exists():
        if not (out / "base.json").exists() and not any(out.glob("*_seed*/config.yaml")):
            raise SystemExit(f"resume: {out} holds no comparison (no args.json, base.json or RUN_seedS/ runs)")
        print(f"resume: {out} has no args.json (an older comparison): its settings are taken to be these", flush=True)
        record.write_text(json.dumps(_settings(args), indent=2) + "\n")
        return
    earlier, now = json.loads(record.read_text()), _settings(args)
    differ = sorted(k for k, v in earlier.items() if k in now and now[k] != v)  # a key added since: its default
    if differ:
        raise SystemExit(f"resume: {out} was started with other settings: " + ", ".join(f"{k}={earlier.get(k)!r}" for k in differ))


def main(argv: list[str] | None = None) -> int:
    return cli.run(compare_arms, Args, "python experiments/default_gain.py", argv, description=__doc__)


def compare_arms(args: Args) -> None:
    out = Path(args.out)
    reused = reused_base(args) if args.base_eval else None  # refused before anything is written
    if args.curve_base_eval and not args.curve_n_eval:
        raise SystemExit("curve_base_eval: give curve_n_eval too (without it the curves use the verdict set's base)")
    reused_curve = reused_base(args, "curve_base_eval") if args.curve_base_eval else None
    _start(out, args)
    h, m = divmod(int(args.minutes * 60), 3600)
    budget = f"00:{h:02d}:{m // 60:02d}:{m % 60:02d}"
    base = reused or evaluate(out / "base.json", "shipped", args.n_eval, args.eval_seed)
    curve_n, curve_seed = (args.curve_n_eval, args.curve_eval_seed) if args.curve_n_eval else (args.n_eval, args.eval_seed)
    curve_base = reused_curve or (evaluate(out / "base_curve.json", "shipped", curve_n, curve_seed) if args.curve_n_eval else base)
    rows = [{"arm": "base", "seed": "-", "steps": 0, **paired_gain(base, base)}]
    curve: list[dict] = []  # every scored checkpoint, then the final policy, per run
    scored: dict[tuple[str, int, int], dict] = {}  # (arm, seed, step) -> evaluation, for the paired control comparison
    # Seed by seed, every arm of a seed before the next seed: a comparison cut short holds paired
    # seeds of every arm. Tables list the runs arm by arm.
    for seed in args.seeds:
        for arm, experiment, extra in arms(args):
            run_dir = out / f"{arm.replace('+', '_')}_seed{seed}"
            steps_cap = [] if args.max_steps is None else [f"trainer.max_steps={args.max_steps}"]
            parts = train(args, run_dir, ["-m", "jagg_lab.train", f"+experiment={experiment}", f"seed={seed}",
                                          f"trainer.max_time={budget}", "heldout.n_samples=0", *steps_cap, *extra, *args.overrides],
                          budget_s=int(args.minutes * 60))
            phase = gradient_phase(run_dir, parts)
            steps = phase["steps"]
            checkpoints = {int(c.stem.removeprefix("step_")): c for part in parts for c in (part / "checkpoints").glob("step_*.ckpt")}
            for step, ckpt in sorted(checkpoints.items()):
                if step < steps:
                    scored[arm, seed, step] = evaluate(run_dir / f"eval_{ckpt.stem}.json", str(ckpt), curve_n, curve_seed)
                    curve.append({"arm": arm, "seed": seed, "steps": step, **paired_gain(scored[arm, seed, step], curve_base)})
            policy = str(final_policy(parts))
            final = evaluate(run_dir / "eval.json", policy, args.n_eval, args.eval_seed)
            rows.append({"arm": arm, "seed": seed, **phase, **paired_gain(final, base)})
            if args.curve_n_eval:
                scored[arm, seed, steps] = evaluate(run_dir / "eval_curve.json", policy, curve_n, curve_seed)
                curve.append({"arm": arm, "seed": seed, "steps": steps, **paired_gain(scored[arm, seed, steps], curve_base)})
            else:
                scored[arm, seed, steps] = final
                curve.append(rows[-1])
    place = {arm: i for i, (arm, _, _) in enumerate(arms(args))}
    rows[1:] = sorted(rows[1:], key=lambda r: place[r["arm"]])  # stable: seeds in order within an arm
    curve.sort(key=lambda r: place[r["arm"]])
    summary = [_arm_summary(name, [r for r in rows if r["arm"] == name]) for name in dict.fromkeys(r["arm"] for r in rows)]
    vs_control = _versus_control(scored, args)
    (out / "gain.json").write_text(json.dumps({"args": OmegaConf.to_container(OmegaConf.structured(args)), "runs": rows,
                                               "arms": summary, "checkpoints": curve, "vs_control": vs_control}, indent=2) + "\n")
    lines = [f"held-out prompts, n = {args.n_eval} (evaluate seed {args.eval_seed}); at most {args.minutes:g} min of training per run;",
             "gain +- the standard error of the paired per-sample difference to the base", ""]
    lines += _table(rows)
    if args.curve_n_eval:
        lines += ["", f"Every scored checkpoint and final policy, on n = {curve_n} (evaluate seed {curve_seed}):"]
    else:
        lines += ["", "Every scored checkpoint:"]
    lines += [""] + _table(curve)
    lines += ["", "| arm | runs | strict gain (mean +- std) | dense gain (mean +- std) |", "|---|---|---|---|"]
    lines += [f"| {a['arm']} | {a['runs']} | {a['strict_gain_mean']:+.3f} +- {a['strict_gain_std']:.3f} "
              f"| {a['dense_gain_mean']:+.3f} +- {a['dense_gain_std']:.3f} |" for a in summary]
    if vs_control:
        lines += ["", f"{args.experiments[0]} minus its shuffled control, same seed and step "
                  "(+- the standard error of the paired per-sample difference):", "",
                  "| seed | steps | strict | dense |", "|---|---|---|---|"]
        lines += [f"| {r['seed']} | {r['steps']} | {r['strict_gain']:+.3f} +- {r['strict_gain_se']:.3f} "
                  f"| {r['dense_gain']:+.3f} +- {r['dense_gain_se']:.3f} |" for r in vs_control]
    (out / "gain.md").write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")


def _versus_control(scored: dict[tuple[str, int, int], dict], args: Args) -> list[dict]:
    """The first experiment against its shuffled-advantage control at every (seed, step) both were scored at."""
    if not args.control:
        return []
    real, control = args.experiments[0], f"{args.experiments[0]}+shuffled"
    return [{"seed": seed, "steps": step, **paired_gain(result, scored[control, seed, step])}
            for (arm, seed, step), result in scored.items() if arm == real and (control, seed, step) in scored]


def _arm_summary(arm: str, rows: list[dict]) -> dict:
    def spread(key: str) -> tuple[float, float]:
        values = [r[key] for r in rows]
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    (sm, ss), (dm, ds) = spread("strict_gain"), spread("dense_gain")
    cost = {key: statistics.fmean(r[key] for r in rows) for key in ("backward_items", "gradient_s") if key in rows[0]}
    return {"arm": arm, "runs": len(rows), "strict_gain_mean": sm, "strict_gain_std": ss, "dense_gain_mean": dm,
            "dense_gain_std": ds, **cost}


def _table(rows: list[dict]) -> list[str]:
    lines = ["| arm | seed | steps | held-out strict | gain | dense | gain |", "|---|---|---|---|---|---|---|"]
    return lines + [f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['strict_accuracy']:.3f} | {r['strict_gain']:+.3f} +- {r['strict_gain_se']:.3f} "
                    f"| {r['dense_score']:.3f} | {r['dense_gain']:+.3f} +- {r['dense_gain_se']:.3f} |" for r in rows]


if __name__ == "__main__":
    sys.exit(main())
