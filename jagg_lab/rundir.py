"""The run directory every entry point writes into: never reused, with metrics in RUN_DIR/metrics.csv."""
from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import warnings
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.fabric.loggers.logger import rank_zero_experiment

__all__ = ["ConfigError", "check_fresh_run_dir", "run_summary", "unfinished_run", "run_logger", "RUN_OUTPUTS", "remove_run_outputs"]

_RUN_MARKERS = ("metrics.csv", "checkpoints", "config.yaml")


class ConfigError(ValueError):
    """An invalid configuration, reported before any work starts."""


def run_summary(run_dir: Path) -> dict | None:
    """A run's summary.json, or None for a run killed before it wrote it (a run writes it last,
    with `interrupted` set if a signal stopped it, and `unfinished` if that came after training)."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):  # absent, or cut short mid-write
        return None


def unfinished_run(run_dir: Path) -> str | None:
    """What a run directory left by a killed or interrupted run is, and how to go on from it
    (None for a run that finished)."""
    run_dir = Path(run_dir)
    summary = run_summary(run_dir) or {"interrupted": "killed"}
    interrupted = summary.get("interrupted")
    if interrupted is None:
        return None
    how = "was killed (no summary.json)" if interrupted == "killed" else f"was interrupted ({interrupted})"
    if "unfinished" in summary:
        return f"{how} after its last step: its summary.json names what is unfinished and the command that finishes it"
    last = run_dir / "checkpoints" / "last.ckpt"
    if not last.exists():
        return f"{how} before it wrote checkpoints/last.ckpt: nothing to resume"
    return f"{how}: continue it with resume={last} hydra.run.dir=NEW_DIR"


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(err: BaseException) -> bool:
    """Whether `err` (or an error it was raised from) is a full disk or an exhausted quota."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in DISK_FULL:
            return True
        err = err.__cause__ or err.__context__
    return False


def resume_command(last: Path | None, overrides: list[str], new_dir: Path | str = "NEW_DIR") -> str:
    """The command that goes on from checkpoint `last` (None: starts afresh) with a run's other
    overrides, into `new_dir` (by default a placeholder the user replaces)."""
    kept = [o for o in overrides if not o.startswith(("resume=", "hydra.run.dir="))]
    command = ["python", "-m", "jagg_lab.train", *kept, *([f"resume={last}"] if last is not None else [])]
    return " ".join(shlex.quote(a) for a in command) + \
        (" hydra.run.dir=NEW_DIR" if new_dir == "NEW_DIR" else f" {shlex.quote(f'hydra.run.dir={new_dir}')}")


def evaluate_command(run: Path, settings: dict, base: Path | None = None) -> str:
    """The `jagg_lab.evaluate` command of a held-out evaluation's settings (a verdict's), graded
    against the base's scores kept in `base` (a run's .ckpt) when given."""
    args = " ".join(f"{k}={settings[k]}" for k in ("n_samples", "seed", "num_steps", "guidance", "shift", "batch_size"))
    if settings.get("categories"):
        args += " " + shlex.quote("categories=[" + ",".join(settings["categories"]) + "]")
    return (f"python -m jagg_lab.evaluate source=policy run={shlex.quote(str(run))} {args}"
            + (f" base={shlex.quote(str(base))}" if base is not None else ""))


def disk_full_message(run_dir: Path, err: BaseException, overrides: list[str], verdict: dict | None = None) -> str:
    """One line for a run stopped by a full disk: what failed, what is whole, how to go on. verdict:
    the verdict's evaluation settings when training had finished and only the verdict was left."""
    while not (isinstance(err, OSError) and err.errno in DISK_FULL):
        err = err.__cause__ or err.__context__
    said = f"jagg_lab.train: the disk is full ({err.strerror}{f' writing {err.filename}' if err.filename else ''})"
    last = run_dir / "checkpoints" / "last.ckpt"
    if not last.exists():
        return f"{said}; no checkpoint was written yet: free space and start again"
    if verdict is not None:
        return f"{said} after training had finished; {last} holds the trained policy: free space, then grade it with: " \
               + evaluate_command(last, verdict, base=last)
    return f"{said}; {last} holds the last whole checkpoint: free space, then go on with: {resume_command(last, overrides)}"


def check_fresh_run_dir(run_dir: Path) -> None:
    taken = [name for name in _RUN_MARKERS if (run_dir / name).exists()]
    if taken:
        state = unfinished_run(run_dir)
        raise ConfigError(f"run directory {run_dir} already holds a run ({', '.join(taken)})"
                          + (f" that {state}" if state else "") + "; choose another hydra.run.dir")


# metrics.csv's first columns, in this order; the others follow alphabetically (readers go by name).
HEADLINE_COLUMNS = ("step", "reward_mean", "reward_std", "loss", "grad_norm", "clip_frac", "approx_kl", "kl", "lr",
                    "time_rollout_s", "time_reward_s", "time_gradient_s", "backward_passes", "rollout_forwards")


class _MetricsWriter(ExperimentWriter):
    """Lightning's CSV writer, with the headline columns first instead of every column alphabetical;
    an append that fails (a full disk) is cut back to the rows written before it, never a half row."""

    def save(self) -> None:
        path = Path(self.metrics_file_path)
        # the rows so far: a new column makes Lightning rewrite the whole file before appending
        before = path.read_bytes() if path.is_file() else None
        try:
            super().save()
        except OSError:
            if before is None:
                path.unlink(missing_ok=True)
            else:  # the space the failed write took is freed first, so the old bytes fit again
                os.truncate(path, 0)
                path.write_bytes(before)
            raise

    def _record_new_keys(self) -> set[str]:
        new_keys = super()._record_new_keys()  # sorted by name; the stable sort below keeps that for the rest
        self.metrics_keys.sort(key=lambda k: HEADLINE_COLUMNS.index(k) if k in HEADLINE_COLUMNS else len(HEADLINE_COLUMNS))
        return new_keys


class _RunCSVLogger(CSVLogger):
    @property
    @rank_zero_experiment
    def experiment(self) -> _MetricsWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _MetricsWriter(log_dir=self.log_dir)
        return self._experiment


def run_logger(run_dir: Path, flush_logs_every_n_steps: int) -> CSVLogger:
    """A CSV logger writing RUN_DIR/metrics.csv, step and the headline columns first. The caller has
    checked that RUN_DIR holds no earlier run, so Lightning's warning that the (Hydra-made)
    directory "will be deleted" is false and muted."""
    warnings.filterwarnings("ignore", message="Experiment logs directory .* exists and is not empty")
    return _RunCSVLogger(save_dir=str(run_dir), name="", version="", flush_logs_every_n_steps=flush_logs_every_n_steps)


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
