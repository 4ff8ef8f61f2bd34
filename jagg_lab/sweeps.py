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
import multiprocessing
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

__all__ = ["STOPPING", "PLAN", "plan_jobs", "planned_jobs", "job_parts", "job_status", "sweep_report", "sweep_stopping",
           "mark_sweep_stopping", "stopping_signal", "in_local_sweep", "idle_worker_ignores_signals", "stop_on_signal", "main",
           "parent_ended", "leave_when_orphaned", "job_running"]

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


def parent_ended() -> bool:
    """Whether this process was started by multiprocessing (a sweep's worker) and the process
    that started it has ended. Its sentinel says so where multiprocessing keeps one (fork, spawn,
    forkserver, whose children have the fork server as their parent id); a loky worker (Hydra's
    joblib launcher) has none, and is handed to another parent when its own ends."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return False
    if parent.sentinel is not None:
        return not parent.is_alive()
    return os.getppid() != parent.pid


_JOBS = {"running": False, "watching": False}  # this worker process: is a job running, is the orphan watch on


def leave_when_orphaned(poll_s: float = 2.0) -> None:
    """In a sweep's worker: once the sweep's process has ended, end this process as soon as no job
    runs in it (a running job stops by itself, `SafeStop`). Without this, a worker idle when the
    sweep was killed, or whose job finished after, waits for work that never comes. Started once."""
    if _JOBS["watching"] or multiprocessing.parent_process() is None:
        return
    _JOBS["watching"] = True

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if not _JOBS["running"] and parent_ended():
                log.warning("the sweep that started this worker has ended: the worker exits")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="sweep-orphan-watch", daemon=True).start()


@contextmanager
def job_running() -> Iterator[None]:
    """Marks a job as running in this process (`leave_when_orphaned` waits for it)."""
    _JOBS["running"] = True
    try:
        yield
    finally:
        _JOBS["running"] = False


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


PLAN = "jobs.json"  # in the sweep directory: each job's directory and overrides, written before any job starts


def plan_jobs(sweep_dir: Path, jobs: dict[int, tuple[str, Sequence[str]]]) -> None:
    """Record the sweep's jobs (number -> (directory relative to `sweep_dir`, overrides)) in
    SWEEP_DIR/jobs.json before any starts, so that what each job left can be said even after the
    sweep's own process was killed. Jobs of an earlier batch of the same sweep are kept."""
    path = Path(sweep_dir) / PLAN
    known = {int(k): v for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}
    known.update({num: {"dir": str(subdir), "overrides": list(overrides)} for num, (subdir, overrides) in jobs.items()})
    tmp = path.with_name(f".{PLAN}.tmp")
    tmp.write_text(json.dumps({str(k): known[k] for k in sorted(known)}, indent=1) + "\n")
    tmp.replace(path)


def planned_jobs(sweep_dir: Path) -> dict[int, tuple[Path, list[str]]]:
    """The jobs `plan_jobs` recorded, by job number: each one's directory (under `sweep_dir`) and overrides."""
    path = Path(sweep_dir) / PLAN
    if not path.is_file():
        raise FileNotFoundError(f"{sweep_dir} is not a local sweep's directory (no {PLAN}; the sweeps of "
                                "hydra/launcher=local write it when they start)")
    plan = json.loads(path.read_text())
    return {int(k): (Path(sweep_dir) / plan[k]["dir"], list(plan[k]["overrides"])) for k in sorted(plan, key=int)}


def job_parts(run_dir: Path) -> list[Path]:
    """A job's directory and its resumptions (RUN_resumed1, RUN_resumed2, ...) that exist, in order."""
    parts, k = [Path(run_dir)], 1
    while (part := Path(run_dir).with_name(f"{Path(run_dir).name}_resumed{k}")).is_dir():
        parts.append(part)
        k += 1
    return parts


def job_status(run_dir: Path, overrides: Sequence[str], error: BaseException | None = None) -> str:
    """One line on a sweep job: finished, stopped or killed with the command that goes on (from its
    latest part's checkpoints/last.ckpt into the next part, RUN_resumedK), failed (`error`, what the
    job raised) or never started (with the command that starts it)."""
    from jagg_lab.rundir import resume_command, run_summary  # not at import: a sweep's worker imports this first

    if error is not None:
        return f"{run_dir}: failed: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    parts = job_parts(run_dir)
    current = parts[-1]
    if not current.is_dir():
        return f"{run_dir}: never started; next: {resume_command(None, list(overrides), current)}"
    where = f" (its part {current.name})" if len(parts) > 1 else ""
    summary = run_summary(current)
    if summary is not None and (summary.get("interrupted") is None or summary.get("unfinished") == []):
        return f"{run_dir}: finished, {summary.get('steps')} steps{where}"  # or stopped once nothing was left
    if summary is not None and "unfinished" in summary:  # after its last step: what is left is not training
        return f"{run_dir}: stopped by {summary['interrupted']} after its last step ({summary.get('steps')} steps){where}; next: {summary.get('next')}"
    last = current / "checkpoints" / "last.ckpt"
    after = f"stopped by {summary['interrupted']} after {summary.get('steps')} steps" if summary is not None \
        else "ended without a summary (killed, or still running)"
    if last.is_file():
        following = current.with_name(f"{Path(run_dir).name}_resumed{len(parts)}")
        return f"{run_dir}: {after}{where}; next: {resume_command(last, list(overrides), following)}"
    source = parts[-2] / "checkpoints" / "last.ckpt" if len(parts) > 1 else None
    return (f"{run_dir}: {after}{where} before its first checkpoint (nothing to resume in it): move {current} out of "
            f"the sweep directory, then next: {resume_command(source, list(overrides), current)}")


def sweep_report(sweep_dir: Path, errors: dict[int, BaseException] | None = None, write: bool = True) -> list[str]:
    """One line per planned job (`job_status`; `errors`: what jobs raised, by job number), logged
    and, with `write`, written to SWEEP_DIR/jobs.txt."""
    errors = errors or {}
    lines = [job_status(run_dir, overrides, errors.get(num)) for num, (run_dir, overrides) in planned_jobs(sweep_dir).items()]
    if write:
        (Path(sweep_dir) / "jobs.txt").write_text("\n".join(lines) + "\n")
    for line in lines:
        log.info("sweep job %s", line)
    return lines


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


def main(argv: Sequence[str] | None = None) -> int:
    """python -m jagg_lab.sweeps SWEEP_DIR: what each job of a local sweep left and the command
    that goes on with it (also after the sweep's own process was killed: no jobs.txt then).
    Exit status 0 when every job finished, 1 when some have a next command, 2 for a directory
    that is not a local sweep's."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jagg_lab.sweeps", description=main.__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="the sweep's directory (hydra.sweep.dir)")
    args = parser.parse_args(argv)
    try:
        lines = sweep_report(args.sweep_dir, write=False)
    except FileNotFoundError as err:
        print(f"jagg_lab.sweeps: {err}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    left = sum(" next: " in line or ": failed: " in line for line in lines)
    print(f"{len(lines)} jobs: {len(lines) - left} finished, {left} to go on with (run each line's next command)")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
