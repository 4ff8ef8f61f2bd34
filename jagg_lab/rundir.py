"""The run directory every entry point writes into: never reused, with metrics in RUN_DIR/metrics.csv."""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger

__all__ = ["ConfigError", "check_fresh_run_dir", "run_logger", "RUN_OUTPUTS", "remove_run_outputs"]

_RUN_MARKERS = ("metrics.csv", "checkpoints", "config.yaml")


class ConfigError(ValueError):
    """An invalid configuration, reported before any work starts."""


def check_fresh_run_dir(run_dir: Path) -> None:
    taken = [name for name in _RUN_MARKERS if (run_dir / name).exists()]
    if taken:
        raise ConfigError(f"run directory {run_dir} already holds a run ({', '.join(taken)}); choose another hydra.run.dir")


def run_logger(run_dir: Path, flush_logs_every_n_steps: int) -> CSVLogger:
    """A CSV logger writing RUN_DIR/metrics.csv. The caller has checked that RUN_DIR holds no earlier
    run, so Lightning's warning that the (Hydra-made) directory "will be deleted" is false and muted."""
    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
    return CSVLogger(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=flush_logs_every_n_steps)


# Everything a training run writes into its directory.
RUN_OUTPUTS = ("config.yaml", "train.log", "metrics.csv", "heldout.csv", "summary.json", "policy.safetensors",
               "policy_ema.safetensors", "checkpoints", "samples", "tensorboard", "wandb")


def remove_run_outputs(run_dir: Path, keep: set[str] = frozenset()) -> None:
    """Remove what a failed run wrote (the names a run writes, except those in `keep`, which
    were there before it started), and the directory if that empties it."""
    for name in set(RUN_OUTPUTS) - set(keep):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    if run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()
