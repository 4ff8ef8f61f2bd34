"""A local sweep (`--multirun hydra/launcher=local`) that survives its own interruption.

Hydra's joblib launcher, with two changes. Ctrl-C reaches the sweep's process and its workers
alike (the terminal signals the whole process group); each job then finishes its step, writes
`last.ckpt` and its summary (`jagg_lab.callbacks.SafeStop`). Joblib, on the sweep's
KeyboardInterrupt, would kill its workers mid-step; here the sweep's process instead takes the
first SIGINT (or SIGHUP: a closed terminal) as "stop": it marks the sweep directory so that no
job starts after it, and waits for the running jobs to stop cleanly. A second Ctrl-C quits at
once, as before. When the jobs are done the sweep says, one line per job, whether it finished,
stopped (with its resume command) or never started, and writes the same lines to
`SWEEP_DIR/jobs.txt`; a stopped sweep exits with 128 + the signal.

The launcher itself is `hydra_plugins.jagg_lab_launcher.LocalLauncher` (Hydra takes launchers
from its plugin namespace only), `conf/hydra/launcher/local.yaml` its config; it is this
module's functions around the joblib launcher's own `launch`.
"""
from __future__ import annotations

import json
import logging
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

__all__ = ["STOPPING", "job_status", "sweep_stopping", "mark_sweep_stopping", "stopping_signal", "in_local_sweep",
           "idle_worker_ignores_signals", "stop_on_signal", "report_jobs"]

log = logging.getLogger(__name__)

STOPPING = ".stopping"  # in the sweep directory: the sweep was told to stop, start no further job


def sweep_stopping(run_dir: Path) -> bool:
    """Whether `run_dir` is a job of a sweep that was told to stop (its directory's marker)."""
    return (Path(run_dir).parent / STOPPING).is_file()


def mark_sweep_stopping(run_dir: Path, signum: int) -> None:
    """A job of the local sweep stopped by `signum`: no further job of the sweep starts. A job run
    in the sweep's own process (n_jobs=1) meets the signal first, in its own handler."""
    marker = Path(run_dir).parent / STOPPING
    if not marker.is_file():
        marker.write_text(f"{signum}\n")


def stopping_signal(sweep_dir: Path) -> int | None:
    """The signal that stopped the sweep (its marker's), or None."""
    marker = Path(sweep_dir) / STOPPING
    if not marker.is_file():
        return None
    text = marker.read_text().strip()
    return int(text) if text.isdigit() else signal.SIGINT


def in_local_sweep() -> bool:
    """Whether this job was launched by the local sweep launcher (any n_jobs)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False
    hydra_cfg = HydraConfig.get()
    return hydra_cfg.mode == RunMode.MULTIRUN and str(hydra_cfg.launcher.get("_target_", "")).endswith("jagg_lab_launcher.LocalLauncher")


def _swallow(signum, frame) -> None:
    """Outside training, a sweep's worker lets the terminal's signal pass: the sweep's process took it."""


def idle_worker_ignores_signals() -> None:
    """In a sweep's worker process, outside training (between jobs, while a job is being built):
    the terminal's Ctrl-C or hangup must not kill the worker (its death breaks the pool, and joblib
    then kills the jobs still stopping). A handler that does nothing, not SIG_IGN, so that training
    (`SafeStop`) still takes the signals; a SIGHUP already ignored (nohup) stays ignored."""
    for sig in (signal.SIGINT, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _swallow)


def job_status(run_dir: Path, error: BaseException | None = None) -> str:
    """One line on a sweep job: finished, stopped with the command that goes on, failed (`error`,
    what the job raised), or never started."""
    if error is not None:
        return f"{run_dir}: failed: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    summary_file = Path(run_dir) / "summary.json"
    if not summary_file.is_file():
        if (Path(run_dir) / "metrics.csv").is_file():
            return f"{run_dir}: ended without a summary (killed?); see python -m jagg_lab.train's message for that directory"
        return f"{run_dir}: never started"
    summary = json.loads(summary_file.read_text())
    if summary.get("interrupted"):
        return f"{run_dir}: stopped by {summary['interrupted']} after {summary.get('steps')} steps; next: {summary.get('next')}"
    return f"{run_dir}: finished, {summary.get('steps')} steps"


@contextmanager
def stop_on_signal(sweep_dir: Path) -> Iterator[list[int]]:
    """While a sweep runs: the first SIGINT or SIGHUP marks `sweep_dir` as stopping (no job starts
    after it; the running ones got the signal too and stop cleanly), a second SIGINT quits at
    once. Yields the list that receives the stopping signal."""
    stopped: list[int] = []
    (sweep_dir / STOPPING).unlink(missing_ok=True)

    def stop(signum, frame):
        if stopped and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: quit now
        if not stopped:
            stopped.append(signum)
            (sweep_dir / STOPPING).write_text(f"{signum}\n")
            log.warning("%s: the running jobs finish their step and stop; no further job starts "
                        "(Ctrl-C again to quit at once)", signal.Signals(signum).name)

    watched = [signal.SIGINT, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]
    # an ignored signal stays ignored (a sweep under nohup outlives its terminal)
    previous = {sig: signal.signal(sig, stop) for sig in watched if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield stopped
        if not stopped and stopping_signal(sweep_dir) is not None:  # a job in this process met the signal first
            stopped.append(stopping_signal(sweep_dir))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        (sweep_dir / STOPPING).unlink(missing_ok=True)


def report_jobs(sweep_dir: Path, run_dirs: Sequence[Path], errors: Sequence[BaseException | None] | None = None) -> list[str]:
    """One line per job (`job_status`; `errors`: what each job raised, None if nothing), logged and
    written to SWEEP_DIR/jobs.txt."""
    errors = errors or [None] * len(run_dirs)
    lines = [job_status(run_dir, error) for run_dir, error in zip(run_dirs, errors)]
    (sweep_dir / "jobs.txt").write_text("\n".join(lines) + "\n")
    for line in lines:
        log.info("sweep job %s", line)
    return lines
