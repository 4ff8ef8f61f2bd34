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

__all__ = ["STOPPING", "job_status", "sweep_stopping", "stop_on_signal", "report_jobs"]

log = logging.getLogger(__name__)

STOPPING = ".stopping"  # in the sweep directory: the sweep was told to stop, start no further job


def sweep_stopping(run_dir: Path) -> bool:
    """Whether `run_dir` is a job of a sweep that was told to stop (its directory's marker)."""
    return (Path(run_dir).parent / STOPPING).is_file()


def job_status(run_dir: Path) -> str:
    """One line on a sweep job: finished, stopped with the command that goes on, or never started."""
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
            (sweep_dir / STOPPING).touch()
            log.warning("%s: the running jobs finish their step and stop; no further job starts "
                        "(Ctrl-C again to quit at once)", signal.Signals(signum).name)

    watched = [signal.SIGINT, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]
    previous = {sig: signal.signal(sig, stop) for sig in watched}
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        (sweep_dir / STOPPING).unlink(missing_ok=True)


def report_jobs(sweep_dir: Path, run_dirs: Sequence[Path]) -> list[str]:
    """One line per job (`job_status`), logged and written to SWEEP_DIR/jobs.txt."""
    lines = [job_status(run_dir) for run_dir in run_dirs]
    (sweep_dir / "jobs.txt").write_text("\n".join(lines) + "\n")
    for line in lines:
        log.info("sweep job %s", line)
    return lines
