"""Collate a directory of training runs into tables and plots.

    python experiments/collate.py runs=outputs/multirun/sweep_windows/<time> [out=DIR] [tail_frac=0.2]

`runs` is any directory holding `jagg_lab.train` runs at any depth (a Hydra multirun
directory, experiments/quality.py's OUT/runs, outputs/runs). A run resumed into a new
directory is one run with the part it resumed (named by the first part's directory; metrics and
held-out evaluations joined, each part cut where the next begins). Writes into `out` (default
RUNS/collated; an existing directory is refused):

- `runs.csv`: one row per run (columns below); `groups.csv`: mean and std over the runs of
  each label (usually: over seeds), as <column>_mean / <column>_std with n_runs;
- `runs.md`: both tables in Markdown;
- `reward_vs_step.png`, `reward_vs_time.png`: training reward, one line per label (mean over
  its runs, band +- one std), smoothed by a trailing mean over 10% of the steps;
- `time_breakdown.png`: seconds per optimizer step in rollout, reward and gradient by label;
- `routing.png` (jagg_routed runs only): where along the trajectory JAGG was deployed;
- `heldout_vs_step.png` (runs with held-out evaluations only): strict and dense held-out gain
  over the base against the optimizer step, one line per label (mean, band +- one std).

Columns of runs.csv:

- `run`: the run's directory relative to RUNS; `label`: the values of the swept keys other
  than the seed (experiments/quality.py: the experiment name);
- the swept keys: config keys whose values differ between runs (`seed`, `strategy.window`, ...);
- `steps`: optimizer steps logged; `reward_first`: reward_mean of the first step;
  `reward_final`: mean reward_mean over the last 20% of the steps (`tail_frac`);
  `reward_strict_final`: the same for the strict reward;
- `time_s`: total training time (rollout + reward + gradient, see jagg_lab/evaluation/runs.py for how
  diagnostic steps are corrected); `time_per_step_s` and `time_rollout_s`,
  `time_reward_s`, `time_gradient_s`: their means per optimizer step;
- `backward_passes`, `backward_items`: means per optimizer step; `grad_cosine`,
  `grad_norm_ratio`: means over the diagnosed micro-batches (strategy.diagnose_every);
- `jagg_frac`, `jagg_frac_<region>`, `route_score_<region>` (jagg_routed): means per step of
  the share of windows routed through JAGG and of their linearity score, overall and per
  noise region (high: mean noise level > 2/3, mid, low: < 1/3);
- `reward_at_time` (experiments/quality.py): like reward_final, over the steps whose rollout
  came from a policy trained for at most the common training time (the shortest run's
  `time_s`); `eval_<name>`: the numbers in the run's eval.json;
- `heldout_step`, `heldout_strict_gain`, `heldout_dense_gain`: the run's last held-out
  evaluation (heldout.csv) and its paired gains over the base; `heldout_best_step` and
  `heldout_best_<strict|dense>_gain`: the evaluation with the best `heldout.metric` (the one
  checkpoints/best.ckpt holds); `verdict_<name>`: the numbers in heldout_final.json (the
  verdict on its own, larger set: `verdict_step` is the step of the policy it graded).
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from jagg_lab import cli  # noqa: E402
from jagg_lab.evaluation.runs import (  # noqa: E402
    ROUTING_REGIONS, TIME_COLUMNS, Run, aggregate, load_runs, markdown_table, mean_std_table, runs_table,
)

log = logging.getLogger("collate")

GROUP_COLUMNS = (
    "steps", "reward_first", "reward_final", "reward_strict_final", "reward_at_time", "time_s", "time_per_step_s",
    *TIME_COLUMNS, "backward_passes", "backward_items", "grad_cosine", "grad_norm_ratio", "jagg_frac",
    *(f"{kind}_{region}" for kind in ("jagg_frac", "route_score") for region in ROUTING_REGIONS),
    "heldout_strict_gain", "heldout_dense_gain", "heldout_best_step", "heldout_best_strict_gain",
    "heldout_best_dense_gain", "verdict_strict_gain", "verdict_dense_gain",
)


@dataclass
class Args:
    runs: str = "outputs/multirun"  # a directory holding jagg_lab.train runs at any depth
    out: str | None = None  # default RUNS/collated
    tail_frac: float = 0.2  # share of the last steps that reward_final averages


def smoothed_reward(run: Run, frac: float = 0.1) -> pd.Series:
    """reward_mean with a trailing mean over max(1, frac * steps) steps."""
    window = max(1, round(frac * len(run.metrics)))
    return run.metrics["reward_mean"].rolling(window, min_periods=1).mean()


def _legend_below(fig, ax) -> None:
    """One legend under the figure: labels of swept keys can be long."""
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(3, len(names)), fontsize="small")


def _band(ax, x, curves: np.ndarray, name: str) -> None:
    mean, std = np.nanmean(curves, 0), np.nanstd(curves, 0)
    (line,) = ax.plot(x, mean, label=f"{name} (n={len(curves)})")
    if len(curves) > 1:
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)


def plot_reward_curves(runs: list[Run], labels: dict[Path, str], out: Path) -> list[Path]:
    """reward_vs_step.png and reward_vs_time.png: mean +- std over each label's runs."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(labels[run.path], []).append(run)
    fig_step, ax_step = plt.subplots(figsize=(6, 4))
    fig_time, ax_time = plt.subplots(figsize=(6, 4))
    for name, members in groups.items():
        by_step = pd.concat([smoothed_reward(r).set_axis(r.metrics["step"]) for r in members], axis=1)
        _band(ax_step, by_step.index.to_numpy(), by_step.to_numpy().T, name)
        # On a common time axis up to the shortest member, each run interpolated onto it.
        grid = np.linspace(0.0, min(r.metrics["trained_s"].iloc[-1] for r in members), 100)
        curves = np.stack([np.interp(grid, r.metrics["trained_s"], smoothed_reward(r)) for r in members])
        _band(ax_time, grid, curves, name)
    paths = []
    for fig, ax, xlabel, name in ((fig_step, ax_step, "optimizer step", "reward_vs_step.png"),
                                  (fig_time, ax_time, "training time of the sampled policy (s): rollout + reward + gradient", "reward_vs_time.png")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training reward (smoothed)")
        ax.grid(alpha=0.3)
        _legend_below(fig, ax)
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(out / name)
    return paths


def plot_time_breakdown(groups: pd.DataFrame, path: Path) -> Path:
    """Stacked horizontal bars: mean seconds per optimizer step in each phase, by label."""
    fig, ax = plt.subplots(figsize=(7, 1.0 + 0.5 * len(groups)))
    left = np.zeros(len(groups))
    for column in TIME_COLUMNS:
        values = groups[f"{column}_mean"].to_numpy()
        ax.barh(groups["label"], values, left=left, label=column.removeprefix("time_").removesuffix("_s"))
        left += values
    ax.invert_yaxis()  # first label on top
    ax.set_xlabel("seconds per optimizer step")
    ax.legend(fontsize="small", loc="lower right")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_routing(groups: pd.DataFrame, path: Path) -> Path | None:
    """Share of windows routed through JAGG and their linearity score per noise region, by label."""
    routed = groups[groups.get("jagg_frac_mean", pd.Series(np.nan, index=groups.index)).notna()]
    if routed.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(routed)
    x = np.arange(len(ROUTING_REGIONS))
    for i, (_, row) in enumerate(routed.iterrows()):
        for ax, kind in zip(axes, ("jagg_frac", "route_score")):
            values = [row.get(f"{kind}_{region}_mean", np.nan) for region in ROUTING_REGIONS]
            ax.bar(x + i * width, values, width, label=row["label"])
    for ax, ylabel in zip(axes, ("share of windows through JAGG", "window linearity score")):
        ax.set_xticks(x + width * (len(routed) - 1) / 2, [f"{r} noise" for r in ROUTING_REGIONS])
        ax.set_ylabel(ylabel)
    _legend_below(fig, axes[0])
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_heldout_curves(runs: list[Run], labels: dict[Path, str], path: Path) -> Path | None:
    """Held-out strict and dense gain over the base against the step: mean +- std over each
    label's runs, at the steps all of them evaluated."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        if run.heldout is not None and len(run.heldout) > 1:
            groups.setdefault(labels[run.path], []).append(run)
    if not groups:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, members in groups.items():
        steps = sorted(set.intersection(*(set(r.heldout["step"]) for r in members)))
        for ax, key in zip(axes, ("strict_gain", "dense_gain")):
            curves = np.stack([r.heldout.set_index("step").loc[steps, key].to_numpy(float) for r in members])
            _band(ax, np.asarray(steps), curves, name)
    for ax, title in zip(axes, ("strict accuracy", "dense score")):
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"held-out {title} gain over the base")
        ax.grid(alpha=0.3)
    _legend_below(fig, axes[0])
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def collate(
    runs: list[Run], out: Path, *, root: Path | None = None, labels: dict[Path, str] | None = None,
    tail_frac: float = 0.2, at_time: float | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write runs.csv, groups.csv, runs.md and the plots into `out` (which must exist);
    returns (per-run table, per-label table)."""
    if not runs:
        raise ValueError("no runs to collate (directories with config.yaml and metrics.csv)")
    table = runs_table(runs, root=root, labels=labels, tail_frac=tail_frac, at_time=at_time)
    groups = aggregate(table, GROUP_COLUMNS)
    table.to_csv(out / "runs.csv", index=False)
    groups.to_csv(out / "groups.csv", index=False)
    (out / "runs.md").write_text(
        "## Runs\n\n" + markdown_table(table)
        + "\n## Mean ± std over the runs of each label\n\n" + markdown_table(mean_std_table(groups, GROUP_COLUMNS))
    )
    plot_reward_curves(runs, dict(zip((r.path for r in runs), table["label"])), out)
    plot_time_breakdown(groups, out / "time_breakdown.png")
    plot_routing(groups, out / "routing.png")
    plot_heldout_curves(runs, dict(zip((r.path for r in runs), table["label"])), out / "heldout_vs_step.png")
    return table, groups


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return cli.run(_main, Args, "python experiments/collate.py", argv, description=__doc__)


def _main(args: Args) -> int:
    root = Path(args.runs)
    out = Path(args.out) if args.out else root / "collated"
    runs = load_runs(root)
    if not runs:
        sys.stderr.write(f"collate: no runs under {root} (directories with config.yaml and metrics.csv)\n")
        return 2
    try:
        out.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        sys.stderr.write(f"collate: {out} already exists; choose another out=\n")
        return 2
    table, groups = collate(runs, out, root=root, tail_frac=args.tail_frac)
    log.info("%d runs, %d labels -> %s", len(table), len(groups), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
