"""The quality table: does JAGG cost reward, accuracy or distribution quality next to the
full gradient and the equal-budget subsample baseline?

    python experiments/quality.py out=outputs/quality                        # CPU-sized, ~30 min on 2 cores
    python experiments/quality.py scale=paper out=outputs/quality_paper      # more steps, seeds, samples, strategies
    python experiments/quality.py scale=paper device=cuda 'overrides=[trainer.accelerator=gpu]' out=DIR   # on a GPU
    python experiments/quality.py 'experiments=[full,jagg_w4]' 'seeds=[0]' steps=5 n_eval=32 out=DIR   # any field

For each experiment (conf/experiment/<name>.yaml), one `python -m jagg_lab.train --multirun`
trains every seed for `steps` optimizer steps (OUT/runs/<experiment>/seed<s>/; the non-full
strategies with `strategy.diagnose_every`, so metrics.csv logs `grad_cosine`). Then each
trained policy and the base are evaluated in this process (OUT/runs/.../eval.json,
OUT/base_eval.json), experiments/collate.py tabulates and plots the runs (OUT/runs.csv,
OUT/groups.csv, OUT/runs.md, OUT/reward_vs_step.png, OUT/reward_vs_time.png,
OUT/time_breakdown.png), and the table is written: OUT/quality.csv (<metric>_mean and
<metric>_std over seeds), OUT/quality.md (mean ± std), OUT/quality.json (the same rows,
the per-run rows and the settings). An existing OUT is refused.

Columns (mean ± sample std over seeds; the base row is the policy before training):

- `strict_accuracy`, `dense_score`: the shapes verifier on ODE samples (`eval_steps` Euler
  steps, the run's CFG scale and shift) for `n_eval` held-out prompts (`eval_seed`);
- `fid`, `kid`: FID and KID (mean over subsets) of those samples against `n_eval` fresh
  ground-truth renders of held-out prompts (`reference_seed`), on the shapes feature network;
- `strict_<category>`, `dense_<category>` (`category`, counting by default): the same scores on
  that category's evaluation prompts alone, where GRPO's gain on the shapes task concentrates
  (docs/results/learning.md); `category=null` leaves them out;
- `kl_to_base`: KL(trained || base) per dimension, averaged over the steps of the trained
  policy's SDE trajectories (the training sampler) on the first `n_kl` evaluation prompts
  (jagg_lab/evaluation/kl.py);
- `grad_cosine`: mean cosine between the strategy's gradient and the full gradient on the
  same micro-batch, every `diagnose_every`-th micro-batch (not measured for the experiment
  named `full`: 1 by definition);
- `reward_final`: training reward (reward_mean) averaged over the last 20% of the steps;
- `reward_at_equal_time`: the same average over the steps whose rollouts came from a policy
  trained for at most `equal_time_s` (quality.json): the total training time of the fastest
  run (training time = rollout + reward + gradient seconds, the diagnostic's extra removed);
- `time_per_step_s`, `gradient_time_per_step_s`, `backward_passes`: per optimizer step.

Timings are comparable only between runs that ran on the same machine one at a time: leave
`launcher` null (Hydra's sequential launcher) for the wall-clock columns.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from collate import collate  # experiments/collate.py: this script's directory is on sys.path
from jagg_lab import cli
from jagg_lab.evaluation import eval_categories, policy_quality, reference_images, run_policies
from jagg_lab.worlds.shapes import CATEGORIES
from jagg_lab.evaluation.runs import aggregate, equal_time, load_run, markdown_table, mean_std_table

log = logging.getLogger("quality")

# Defaults per scale; a field given on the command line wins.
SCALES = {
    # 9 runs x 20 steps x ~7 s on 2 CPU cores (~21 min), gradient diagnostics (~3 min), 10
    # evaluations (~25 s each): about 30 minutes on an otherwise idle machine.
    "cpu": dict(experiments=["full", "jagg_w4", "subsample_w4"], seeds=[0, 1, 2], steps=20, n_eval=128, n_kl=32,
                diagnose_every=10),
    "paper": dict(experiments=["full", "jagg_w4", "subsample_w4", "jagg_w8", "jagg_routed"], seeds=[0, 1, 2, 3, 4],
                  steps=300, n_eval=1024, n_kl=256, diagnose_every=20),
}
# (column in quality.csv, column of the collated per-run table)
COLUMNS = (
    ("strict_accuracy", "eval_strict_accuracy"),
    ("dense_score", "eval_dense_score"),
    ("fid", "eval_fid"),
    ("kid", "eval_kid_mean"),
    ("kl_to_base", "eval_kl_to_base"),
    ("grad_cosine", "grad_cosine"),
    ("reward_final", "reward_final"),
    ("reward_at_equal_time", "reward_at_time"),
    ("time_per_step_s", "time_per_step_s"),
    ("gradient_time_per_step_s", "time_gradient_s"),
    ("backward_passes", "backward_passes"),
)


@dataclass
class Args:
    scale: str = "cpu"  # cpu | paper: where the fields below are null
    experiments: list[str] | None = None
    seeds: list[int] | None = None
    steps: int | None = None  # optimizer steps per run (trainer.max_steps)
    n_eval: int | None = None  # evaluation prompts per policy (and reference renders for FID/KID)
    n_kl: int | None = None  # of those, trajectories for the KL to the base
    diagnose_every: int | None = None  # gradient diagnostic every N micro-batches (not for full)
    eval_seed: int = 1
    reference_seed: int = 2
    eval_steps: int = 20  # ODE steps for the verifier and FID/KID samples
    category: str | None = "counting"  # also scored on this category's samples alone (null: the mix only)
    tail_frac: float = 0.2
    launcher: str | None = None  # hydra/launcher for training: null (sequential), local, slurm
    device: str = "cpu"  # where the evaluation runs (training: overrides=[trainer.accelerator=gpu])
    out: str = "outputs/quality"
    overrides: list[str] = field(default_factory=list)  # extra training overrides, e.g. ["optimizer.lr=1e-4"]

    def __post_init__(self) -> None:
        resolve(self)  # on the command line: a bad value exits 2 before anything is trained


def resolve(args: Args) -> Args:
    """Fill the null fields from the scale's defaults and check the values."""
    if args.scale not in SCALES:
        raise ValueError(f"scale must be one of {sorted(SCALES)}, got {args.scale!r}")
    for name, value in SCALES[args.scale].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not args.experiments or not args.seeds:
        raise ValueError("experiments and seeds must not be empty")
    if args.steps < 1 or args.diagnose_every < 0:
        raise ValueError(f"steps must be >= 1 and diagnose_every >= 0, got {args.steps} and {args.diagnose_every}")
    if args.n_eval < 2 or not 1 <= args.n_kl <= args.n_eval:
        raise ValueError(f"need n_eval >= 2 (FID/KID) and 1 <= n_kl <= n_eval, got n_eval={args.n_eval}, n_kl={args.n_kl}")
    if args.category is not None:
        if args.category not in CATEGORIES:
            raise ValueError(f"category must be one of {list(CATEGORIES)} or null, got {args.category!r}")
        if args.category not in eval_categories(args.n_eval):
            raise ValueError(f"category={args.category}: none of the n_eval={args.n_eval} evaluation prompts is of it")
    return args


def train(args: Args, experiment: str, sweep_dir: Path) -> list[Path]:
    """Every seed of one experiment in one Hydra multirun; returns the run directories."""
    cmd = [sys.executable, "-m", "jagg_lab.train", "--multirun", f"+experiment={experiment}",
           "seed=" + ",".join(map(str, args.seeds)), f"trainer.max_steps={args.steps}",
           "heldout.n_samples=0", f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=seed${seed}"]
    if experiment != "full" and args.diagnose_every:
        cmd.append(f"strategy.diagnose_every={args.diagnose_every}")
    if args.launcher:
        cmd.append(f"hydra/launcher={args.launcher}")
    cmd += args.overrides
    log.info("training: %s", " ".join(cmd[1:]))
    subprocess.run(cmd, check=True)
    return [sweep_dir / f"seed{seed}" for seed in args.seeds]


def _add_category(result: dict, category: str | None) -> None:
    """The category's scores as top-level numbers (collate tabulates those as eval_* columns)."""
    if category is not None:
        scores = result["per_category"][category]
        result.update({f"strict_{category}": scores["strict_accuracy"], f"dense_{category}": scores["dense_score"]})


def columns(category: str | None) -> tuple[tuple[str, str], ...]:
    """COLUMNS, with the category's strict and dense scores after the mix's."""
    if category is None:
        return COLUMNS
    extra = ((f"strict_{category}", f"eval_strict_{category}"), (f"dense_{category}", f"eval_dense_{category}"))
    return COLUMNS[:2] + extra + COLUMNS[2:]


def evaluate_runs(args: Args, runs: dict[Path, str], out: Path) -> dict:
    """eval.json in every run; returns the base policy's evaluation (written to OUT/base_eval.json)."""
    references: dict[int, torch.Tensor] = {}  # ground-truth renders per resolution
    settings = {k: getattr(args, k) for k in ("n_eval", "n_kl", "eval_seed", "reference_seed", "eval_steps")}
    base_result = None
    for run_dir in runs:
        policy, base, sampler = run_policies(run_dir)
        policy, base = policy.to(args.device), base.to(args.device)
        resolution = policy.sample_shape[-1]
        if resolution not in references:
            references[resolution] = reference_images(args.n_eval, args.reference_seed, resolution)
        common = dict(n_samples=args.n_eval, n_kl=args.n_kl, seed=args.eval_seed, num_steps=args.eval_steps)
        if base_result is None:  # the policy every run starts from (the first run's, for seeded random inits)
            base_result = {**policy_quality(base, None, sampler, references[resolution], **common), "kl_to_base": 0.0,
                           "settings": settings}
            _add_category(base_result, args.category)
            (out / "base_eval.json").write_text(json.dumps(base_result, indent=2) + "\n")
        result = {**policy_quality(policy, base, sampler, references[resolution], **common), "settings": settings}
        _add_category(result, args.category)
        (run_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        log.info("%s: strict %.3f dense %.3f fid %.3f kl %.2e", run_dir.relative_to(out), result["strict_accuracy"],
                 result["dense_score"], result["fid"], result["kl_to_base"])
    return base_result


def quality_table(table: pd.DataFrame, base: dict, category: str | None = None) -> pd.DataFrame:
    """Mean and std over seeds per experiment, base first, columns renamed to `columns(category)`."""
    named = columns(category)
    groups = aggregate(table, [source for _, source in named])
    rename = {"label": "experiment", "n_runs": "n_seeds"}
    for name, source in named:
        rename.update({f"{source}_mean": f"{name}_mean", f"{source}_std": f"{name}_std"})
    groups = groups.rename(columns=rename)
    base_row = {"experiment": "base", "n_seeds": 1, "strict_accuracy_mean": base["strict_accuracy"],
                "dense_score_mean": base["dense_score"], "fid_mean": base["fid"], "kid_mean": base["kid_mean"],
                "kl_to_base_mean": 0.0}
    if category is not None:
        base_row.update({f"{metric}_{category}_mean": base[f"{metric}_{category}"] for metric in ("strict", "dense")})
    ordered = ["experiment", "n_seeds", *(f"{name}_{stat}" for name, _ in named for stat in ("mean", "std"))]
    return pd.concat([pd.DataFrame([base_row]), groups], ignore_index=True).reindex(columns=ordered)


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows for JSON: NaN (a metric not measured) as null, numpy scalars as Python ones."""
    return json.loads(frame.to_json(orient="records"))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return cli.run(make_table, Args, "python experiments/quality.py", argv, description=__doc__)


def make_table(args: Args) -> int:
    """Train, evaluate and tabulate (module docstring); 2 if OUT already exists."""
    out = Path(args.out).resolve()
    try:
        out.mkdir(parents=True, exist_ok=False)  # never overwrite an earlier table
    except FileExistsError:
        sys.stderr.write(f"quality: {out} already exists; choose another out=\n")
        return 2

    runs: dict[Path, str] = {}
    for experiment in args.experiments:
        for run_dir in train(args, experiment, out / "runs" / experiment):
            runs[run_dir] = experiment
    base = evaluate_runs(args, runs, out)

    loaded = [load_run(run_dir) for run_dir in runs]
    at_time = equal_time(loaded)
    table, _ = collate(loaded, out, root=out, labels=runs, tail_frac=args.tail_frac, at_time=at_time)
    quality = quality_table(table, base, args.category)
    quality.to_csv(out / "quality.csv", index=False)
    names = [name for name, _ in columns(args.category)]
    text = (f"Quality after {args.steps} optimizer steps; mean ± std over seeds {list(args.seeds)}; "
            f"reward_at_equal_time at {at_time:.1f} s of training.\n\n"
            + markdown_table(mean_std_table(quality, names, keep=("experiment", "n_seeds"))))
    (out / "quality.md").write_text(text)
    (out / "quality.json").write_text(json.dumps({
        "args": asdict(args), "equal_time_s": at_time, "rows": _records(quality), "runs": _records(table), "base": base,
    }, indent=2) + "\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
