"""Training runs on disk, as tables: what experiments/collate.py, experiments/quality.py and
notebooks/analysis.ipynb read.

A run is a directory written by `python -m jagg_lab.train` holding `config.yaml` and
`metrics.csv` (one row per optimizer step), and maybe `eval.json` (experiments/quality.py),
`heldout.csv` (its held-out evaluations, paired with the base) and `heldout_final.json` (its
held-out verdict).
A Hydra multirun directory holds one run per job; `load_runs` finds them at any depth. A run
resumed into a new directory (`resume=RUN/checkpoints/last.ckpt hydra.run.dir=NEW`) is one run
with the one it resumed: `load_runs` joins such parts, each cut where the next begins (a run
killed after its last checkpoint logged steps its resumption trained again).

Training time is the sum of the `time_rollout_s`, `time_reward_s` and `time_gradient_s`
columns, i.e. the work of the GRPO steps without start-up, logging or checkpointing. A row
on which the gradient diagnostic ran (`grad_cosine` logged, `strategy.diagnose_every`) also
timed the diagnostic's extra full backward passes; `step_times` gives such rows the median
gradient time of the run's other rows, so the measurement does not count as training (a run
whose every row was diagnosed keeps its times as logged).
"""
from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from omegaconf import OmegaConf

__all__ = [
    "TIME_COLUMNS", "ROUTING_REGIONS", "Run", "flatten", "find_runs", "load_run", "load_runs", "resume_chains", "join_parts", "join_steps", "step_times",
    "tail_mean", "swept_keys", "run_label", "summarize", "equal_time", "runs_table", "aggregate", "mean_std_table",
    "markdown_table",
]

log = logging.getLogger(__name__)

TIME_COLUMNS = ("time_rollout_s", "time_reward_s", "time_gradient_s")
# jagg_routed's noise regions (jagg_lab.strategies.routed.NOISE_REGIONS), from noisy to clean.
ROUTING_REGIONS = ("high", "mid", "low")
SEED_KEY = "seed"


@dataclass(frozen=True)
class Run:
    path: Path
    config: dict[str, Any]  # flattened resolved config: {"strategy.window": 4, ...}
    # metrics.csv plus "time_s", the training time at the end of each row, and "trained_s", the
    # training time before its rollout: how long the policy its reward_mean scores had trained.
    metrics: pd.DataFrame
    eval: dict[str, float]  # the numeric top-level entries of eval.json ({} without one)
    heldout: pd.DataFrame | None = None  # heldout.csv: step, scores, gains over the base (None without one)
    verdict: dict[str, float] = field(default_factory=dict)  # numeric top-level entries of heldout_final.json


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def find_runs(root: str | Path) -> list[Path]:
    """Run directories under `root` (itself included), in natural order of their paths (job 2 before 10)."""
    runs = [p.parent for p in Path(root).rglob("metrics.csv") if (p.parent / "config.yaml").is_file()]
    return sorted(runs, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p))])


def step_times(metrics: pd.DataFrame) -> pd.Series:
    """Training seconds per row (rollout + reward + gradient), diagnostic rows corrected."""
    gradient = metrics["time_gradient_s"].astype(float)
    if "grad_cosine" in metrics:
        diagnosed = metrics["grad_cosine"].notna()
        if diagnosed.any() and (~diagnosed).any():
            gradient = gradient.where(~diagnosed, gradient[~diagnosed].median())
    return metrics["time_rollout_s"].astype(float) + metrics["time_reward_s"].astype(float) + gradient


def load_run(path: str | Path) -> Run:
    path = Path(path)
    config = flatten(OmegaConf.to_container(OmegaConf.load(path / "config.yaml"), resolve=True) or {})
    metrics = pd.read_csv(path / "metrics.csv")
    missing = [c for c in ("step", "reward_mean", *TIME_COLUMNS) if c not in metrics]
    if missing:
        raise ValueError(f"{path / 'metrics.csv'} is not a jagg_lab.train log (missing {', '.join(missing)})")
    metrics = _with_times(metrics.sort_values("step", ignore_index=True))
    heldout = pd.read_csv(path / "heldout.csv").sort_values("step", ignore_index=True) if (path / "heldout.csv").is_file() else None
    return Run(path=path, config=config, metrics=metrics, eval=_numbers(path / "eval.json"), heldout=heldout,
               verdict=_numbers(path / "heldout_final.json"))


def _with_times(metrics: pd.DataFrame) -> pd.DataFrame:
    """`metrics` with `time_s` (training seconds at the end of each row) and `trained_s` (before its rollout)."""
    seconds = step_times(metrics)
    return metrics.assign(time_s=seconds.cumsum(), trained_s=seconds.cumsum() - seconds)


def _numbers(path: Path) -> dict[str, float]:
    """The numeric top-level entries of a JSON file ({} without one)."""
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {k: float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def load_runs(root: str | Path) -> list[Run]:
    """Every training run under `root`, resumed parts joined (`join_parts`); directories that are
    not GRPO runs are skipped (logged)."""
    loaded = []
    for path in find_runs(root):
        try:
            loaded.append(load_run(path))
        except (ValueError, pd.errors.EmptyDataError) as err:
            log.warning("skipping %s: %s", path, err)
    return [join_parts(chain) if len(chain) > 1 else chain[0] for chain in resume_chains(loaded)]


def _resumed_from(run: Run, runs: list[Run]) -> Run | None:
    """The run among `runs` whose checkpoint `run` was resumed from (config `resume`), if there.
    The path was given relative to where training ran, so it is matched as the tail of a run's path."""
    resume = run.config.get("resume")
    if not resume:
        return None
    checkpoint = Path(str(resume))
    source = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    tail = source.resolve().parts if source.is_absolute() else source.parts
    matches = [r for r in runs if r is not run and tail and r.path.resolve().parts[-len(tail):] == tail]
    if len(matches) > 1:
        log.warning("%s resumed from %s, which matches %d runs; not joined", run.path, resume, len(matches))
        return None
    return matches[0] if matches else None


def resume_chains(runs: list[Run]) -> list[list[Run]]:
    """`runs` grouped into chains of parts, each resumed from the one before it, in the order of
    their first parts. A run resumed twice from one part (two branches) starts a chain of its own;
    a resumption that trained no step (killed at once) holds nothing and is left out."""
    parent = {id(run): _resumed_from(run, runs) for run in runs}
    empty = {id(run) for run in runs if parent[id(run)] is not None and run.metrics.empty}
    for run in runs:  # a resumption of an empty part continues the part that one resumed
        while parent[id(run)] is not None and id(parent[id(run)]) in empty:
            parent[id(run)] = parent[id(parent[id(run)])]
    runs = [run for run in runs if id(run) not in empty]
    children: dict[int, list[Run]] = {}
    for run in runs:
        if parent[id(run)] is not None:
            children.setdefault(id(parent[id(run)]), []).append(run)
    chains = []
    for run in runs:
        source = parent[id(run)]
        if source is not None and len(children[id(source)]) == 1:
            continue  # a continuation: it joins its source's chain
        chain = [run]
        while len(children.get(id(chain[-1]), [])) == 1 and all(children[id(chain[-1])][0] is not r for r in chain):
            chain.append(children[id(chain[-1])][0])
        chains.append(chain)
    return chains


def join_steps(frames: list[pd.DataFrame | None], begins: list[float] | None = None) -> pd.DataFrame | None:
    """Step-indexed tables of consecutive parts of a run as one: each part's rows before the step
    the next part begins at (a part killed after its last checkpoint logged steps that its
    resumption ran again). `begins`: each part's first trained step (inf for a part that trained
    none); by default the first step of each frame (None or empty: none)."""
    if begins is None:
        begins = _first_steps(frames)
    ends = [min(begins[i + 1:], default=math.inf) for i in range(len(begins))]
    kept = [f[f["step"] < end] for f, end in zip(frames, ends) if f is not None]
    kept = [f for f in kept if len(f)] or kept[:1]  # an empty part would make every column `object`
    return pd.concat(kept, ignore_index=True) if kept else None


def _first_steps(frames: list[pd.DataFrame | None]) -> list[float]:
    """Each frame's first step; inf for none or an empty one (a part killed before a step)."""
    return [f["step"].min() if f is not None and len(f) else math.inf for f in frames]


def join_parts(parts: list[Run]) -> Run:
    """A run and its resumptions as one run: the first part's path and `resume`, the last part's
    config otherwise, metrics and held-out evaluations joined, eval.json and the verdict of the
    last part that has them."""
    begins = _first_steps([p.metrics for p in parts])  # the held-out rows are cut where the metrics are
    metrics = _with_times(join_steps([p.metrics for p in parts], begins))
    config = {**parts[-1].config, "resume": parts[0].config.get("resume")}
    return Run(path=parts[0].path, config=config, metrics=metrics,
               eval=next((p.eval for p in reversed(parts) if p.eval), {}),
               heldout=join_steps([p.heldout for p in parts], begins),
               verdict=next((p.verdict for p in reversed(parts) if p.verdict), {}))


def tail_mean(values: pd.Series, tail_frac: float = 0.2) -> float:
    """Mean of the last ceil(tail_frac * n) values (at least one): a less noisy 'final' value."""
    values = values.dropna()
    if values.empty:
        return math.nan
    return float(values.iloc[-max(1, math.ceil(tail_frac * len(values))):].mean())


def swept_keys(runs: Iterable[Run]) -> list[str]:
    """Config keys whose values differ between runs, `seed` first; a key that only repeats
    another one's values (data.seed = seed) is dropped."""
    runs = list(runs)
    keys = sorted({k for r in runs for k in r.config}, key=lambda k: (k != SEED_KEY, k))
    kept: list[str] = []
    seen: set[tuple] = set()
    for key in keys:
        values = tuple(repr(r.config.get(key)) for r in runs)
        if len(set(values)) > 1 and values not in seen:
            kept.append(key)
            seen.add(values)
    return kept


def _short_target(target: str) -> str:
    """'jagg_lab.strategies.JaggRoutedStrategy' -> 'jagg_routed'."""
    name = target.rsplit(".", 1)[-1].removesuffix("Strategy")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def run_label(run: Run, keys: Iterable[str]) -> str:
    """A short name from the run's values of the swept keys other than the seed, e.g.
    'jagg_routed, cos_threshold=0.9' (a `_target_` by its class, other keys by their last
    part; keys the run does not have are left out); 'all' when nothing else is swept."""
    keys = [k for k in keys if k != SEED_KEY and k in run.config]
    targets = [_short_target(str(run.config[k])) for k in keys if k.endswith("._target_")]
    values = [f"{k.rsplit('.', 1)[-1]}={run.config[k]}" for k in keys if not k.endswith("._target_")]
    return ", ".join(targets + values) or "all"


def summarize(run: Run, *, tail_frac: float = 0.2, at_time: float | None = None) -> dict[str, float]:
    """One run's numbers (see experiments/collate.py for their definitions)."""
    m = run.metrics
    times = step_times(m)
    row: dict[str, float] = {
        "steps": len(m),
        "reward_first": float(m["reward_mean"].iloc[0]),
        "reward_final": tail_mean(m["reward_mean"], tail_frac),
        "reward_strict_final": tail_mean(m["reward_strict"], tail_frac) if "reward_strict" in m else math.nan,
        "time_s": float(m["time_s"].iloc[-1]),
        "time_per_step_s": float(times.mean()),
        **{c: float(m[c].mean()) for c in TIME_COLUMNS},
    }
    row["time_gradient_s"] = float((times - m["time_rollout_s"] - m["time_reward_s"]).mean())
    for column in ("backward_passes", "backward_items", "grad_cosine", "grad_norm_ratio", "jagg_frac",
                   *(f"{kind}_{region}" for kind in ("jagg_frac", "route_score") for region in ROUTING_REGIONS)):
        if column in m and m[column].notna().any():
            row[column] = float(m[column].mean())
    if at_time is not None:
        reached = m[m["trained_s"] <= at_time + 1e-9]
        row["reward_at_time"] = tail_mean(reached["reward_mean"], tail_frac)
    row.update({f"eval_{k}": v for k, v in run.eval.items()})
    if run.heldout is not None and len(run.heldout):
        last = run.heldout.iloc[-1]
        metric = run.config.get("heldout.metric", "dense_score")
        best = run.heldout.loc[run.heldout[metric].idxmax()]  # the first of equal scores, as best.ckpt
        row.update({"heldout_step": float(last["step"]), "heldout_strict_gain": float(last["strict_gain"]),
                    "heldout_dense_gain": float(last["dense_gain"]), "heldout_best_step": float(best["step"]),
                    "heldout_best_strict_gain": float(best["strict_gain"]), "heldout_best_dense_gain": float(best["dense_gain"])})
    row.update({f"verdict_{k}": v for k, v in run.verdict.items()})
    return row


def equal_time(runs: Iterable[Run]) -> float:
    """The training time every run reached: the shortest run's total. summarize(at_time=)
    then averages the rewards of policies trained for at most that long."""
    return min(float(r.metrics["time_s"].iloc[-1]) for r in runs)


def runs_table(
    runs: list[Run], *, root: str | Path | None = None, labels: dict[Path, str] | None = None,
    tail_frac: float = 0.2, at_time: float | None = None,
) -> pd.DataFrame:
    """One row per run: run (path relative to root), label, the swept keys, summarize()."""
    keys = swept_keys(runs)
    rows = []
    for run in runs:
        name = str(run.path.relative_to(root)) if root is not None else str(run.path)
        label = labels[run.path] if labels is not None else run_label(run, keys)
        rows.append({"run": name, "label": label, **{k: run.config.get(k) for k in keys},
                     **summarize(run, tail_frac=tail_frac, at_time=at_time)})
    return pd.DataFrame(rows)


def aggregate(table: pd.DataFrame, columns: Iterable[str], by: str = "label") -> pd.DataFrame:
    """Mean and sample standard deviation (ddof 1, NaN for a single run) of `columns` over the
    runs of each group, as <column>_mean and <column>_std, plus n_runs; groups in order of
    appearance. NaN entries (a metric a run does not log) are left out of both."""
    columns = [c for c in columns if c in table]
    grouped = table.groupby(by, sort=False)
    out = pd.DataFrame({"n_runs": grouped.size()})
    for column in columns:
        values = grouped[column]
        out[f"{column}_mean"] = values.mean()
        out[f"{column}_std"] = values.std(ddof=1)
    return out.reset_index()


def mean_std_table(groups: pd.DataFrame, columns: Iterable[str], digits: int = 3, keep: Iterable[str] = ("label", "n_runs")) -> pd.DataFrame:
    """aggregate()'s output as text cells 'mean ± std' (just the mean for a single run, '-'
    where a metric is missing), for Markdown."""
    out = groups[[c for c in keep if c in groups]].copy()
    for column in columns:
        if f"{column}_mean" not in groups:
            continue
        cells = []
        for mean, std in zip(groups[f"{column}_mean"], groups[f"{column}_std"]):
            if math.isnan(mean):
                cells.append("-")
            else:
                cells.append(f"{mean:.{digits}f}" + ("" if math.isnan(std) else f" ± {std:.{digits}f}"))
        out[column] = cells
    return out


def _cell(value: Any, digits: int) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if 0 < abs(value) < 0.01:  # a learning rate or a KL weight keeps its digits (5e-05, not 0.0001)
            return f"{value:.{digits}g}"
        return f"{value:.{digits}f}"
    return "-" if value is None else str(value).replace("|", "\\|")


def markdown_table(table: pd.DataFrame, digits: int = 4) -> str:
    """A GitHub Markdown table (floats with `digits` decimals, or `digits` significant digits
    below 0.01; NaN as '-')."""
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v, digits) for v in row) + " |")
    return "\n".join(lines) + "\n"
