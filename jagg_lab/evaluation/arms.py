"""What the experiments/ scripts share about a comparison's arms: evaluations of their final
policies (`load_evaluation`), their training runs' parts and cost (`run_parts`, `run_metrics`,
`gradient_phase`), and the small parsers and summaries of their command lines (`named_pairs`,
`mean_std`). The scripts are command lines over these; tests call them here."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd

from jagg_lab.evaluation.runs import join_steps

__all__ = ["load_evaluation", "run_parts", "COST_COLUMNS", "run_metrics", "gradient_phase", "named_pairs", "mean_std"]


def load_evaluation(path: str, verdict: bool = True) -> dict:
    """An evaluation with per-sample scores. verdict: a training run's heldout_final.json stands for
    the evaluation of the policy it graded (the last, or the best under heldout.restore_best); a
    reference or base must be an evaluation itself (verdict=False), since that file also holds the
    base's scores and would otherwise compare the trained policy with itself."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no evaluation at {path} (write one with python -m jagg_lab.evaluate ... out={path})")
    result = json.loads(Path(path).read_text())
    if "per_sample" not in result and "per_sample" in result.get("final", {}):
        if not verdict:
            raise ValueError(f"{path} is a training run's verdict (heldout_final.json), not an evaluation of one "
                             "policy; pass the base's evaluation as the reference")
        result = result["final"]
    if "per_sample" not in result:
        raise ValueError(f"{path} holds no per-sample scores; evaluate it again with the current jagg_lab.evaluate")
    return result


def run_parts(run_dir: Path) -> list[Path]:
    """A run's directory, then those its resumptions wrote (RUN_DIR_resumed1, ...), in order."""
    parts = [run_dir]
    while (part := run_dir.with_name(f"{run_dir.name}_resumed{len(parts)}")).exists():
        parts.append(part)
    return parts


COST_COLUMNS = ("step", "time_gradient_s", "backward_items")


def run_metrics(parts: list[Path]) -> pd.DataFrame:
    """The metrics.csv of a run's parts as one table, each part cut where the next begins
    (`jagg_lab.evaluation.runs.join_steps`; a part killed before its first step has none, or an
    empty one). ValueError naming a file without the columns the cost needs."""
    frames = []
    for part in parts:
        path = part / "metrics.csv"
        try:
            frame = pd.read_csv(path)
        except (FileNotFoundError, pd.errors.EmptyDataError):
            frame = None
        if frame is not None and not set(COST_COLUMNS) <= set(frame.columns):
            raise ValueError(f"{path}: no {', '.join(sorted(set(COST_COLUMNS) - set(frame.columns)))} column")
        frames.append(frame)
    joined = join_steps(frames)
    return joined if joined is not None else pd.DataFrame(columns=list(COST_COLUMNS))


def gradient_phase(run_dir: Path, parts: list[Path] | None = None) -> dict:
    """Steps, summed gradient-phase seconds and mean backward items per step of a run's metrics
    (those of its resumptions included: `parts`, or the RUN_DIR_resumedK beside it)."""
    metrics = run_metrics(parts or run_parts(run_dir))
    return {"steps": len(metrics), "gradient_s": float(metrics["time_gradient_s"].sum()),
            "backward_items": float(metrics["backward_items"].mean()) if len(metrics) else 0.0}


def named_pairs(entries: list[str], key: str) -> list[tuple[str, str]]:
    """[(NAME, VALUE)] of command-line entries NAME=VALUE; ValueError naming `key` otherwise."""
    bad = [e for e in entries if "=" not in e]
    if bad:
        raise ValueError(f"{key}: entries must read NAME=VALUE, got {bad}")
    return [tuple(e.split("=", 1)) for e in entries]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (NaN for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else float("nan")
