"""A local sweep killed anywhere loses nothing: a small `--multirun hydra/launcher=local` sweep
(3 jobs of 6 steps, 2 at a time) is hit at a random point by SIGINT or SIGHUP to its process group
(the terminal's Ctrl-C, a closed terminal), SIGTERM or SIGKILL to the sweep's process, or a signal
to one worker; then `python -m jagg_lab.sweeps SWEEP_DIR` is asked what each job left and its next
commands are run, as a user would, until every job has finished. Each job must then read
(`jagg_lab.evaluation.load_runs`: resumed parts joined) as the uninterrupted sweep's job did,
row for row, with exactly one `last.ckpt` at the final step. The counts are in
docs/results/reliability.md."""
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from jagg_lab.evaluation.runs import load_runs
from jagg_lab.sweeps import job_parts, planned_jobs, sweep_report
from tests.test_interrupts import EVERY_STEP, SMALL
from tests.test_train_cli import REPO

pytestmark = pytest.mark.slow
psutil = pytest.importorskip("psutil")

STEPS = 6
# Steps of about half a second (more prompts and sampling steps than the kill tests' runs), so that
# a signal sent after some rows lands inside training rather than after it.
SLOWER = {"data.prompts_per_step": "2", "sampler.num_steps": "8"}
SWEEP = [*(o for o in SMALL if o.split("=")[0] not in SLOWER), *(f"{k}={v}" for k, v in SLOWER.items()),
         f"trainer.max_steps={STEPS}", "checkpoint_every=2", EVERY_STEP, "seed=0,1,2", "hydra.launcher.n_jobs=2"]
# One thread everywhere: the sweep's workers and the single runs that resume its jobs compute alike.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# (signal, whom): "group" is the sweep's whole process group, as a terminal signals it.
KILLS = [("INT", "group"), ("HUP", "group"), ("TERM", "sweep"), ("KILL", "sweep"),
         ("TERM", "worker"), ("INT", "worker"), ("KILL", "worker")]


def start_sweep(sweep_dir):
    return subprocess.Popen([sys.executable, "-m", "jagg_lab.train", "--multirun", "hydra/launcher=local", *SWEEP,
                             f"hydra.sweep.dir={sweep_dir}"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def rows_logged(sweep_dir):
    """metrics.csv rows written so far by all the sweep's jobs."""
    return sum(max(0, len(p.read_text().splitlines()) - 1) for p in sweep_dir.glob("*/metrics.csv"))


def comparable(run):
    """A run's metrics but its timings, in a fixed column order."""
    kept = sorted(c for c in run.metrics.columns if not c.startswith("time_") and c != "trained_s")
    return run.metrics[kept].reset_index(drop=True)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted sweep: each job's joined metrics, by seed."""
    sweep_dir = tmp_path_factory.mktemp("straight") / "sweep"
    proc = start_sweep(sweep_dir)
    assert proc.wait(timeout=900) == 0
    runs = load_runs(sweep_dir)
    assert len(runs) == 3 and all(len(run.metrics) == STEPS for run in runs)
    return {run.config["seed"]: comparable(run) for run in runs}


def hit(sweep_dir, proc, name, whom, rows):
    """Wait until the jobs have logged `rows` metrics rows, then send SIG`name` to `whom`; wait
    for the sweep and every worker to end. Returns what was hit ("too late" if the sweep ended first)."""
    signum = getattr(signal, f"SIG{name}")
    deadline = time.monotonic() + 600
    while rows_logged(sweep_dir) < rows:
        if proc.poll() is not None:
            return "too late"
        assert time.monotonic() < deadline, "the sweep did not get that far"
        time.sleep(0.05)
    family = psutil.Process(proc.pid).children(recursive=True)
    if whom == "group":
        os.killpg(proc.pid, signum)
    elif whom == "sweep":
        os.kill(proc.pid, signum)
    else:  # a worker that is training a job (its process has a grandchild-free, busy CPU) or any worker
        workers = [p for p in family if "loky" in " ".join(p.cmdline()) and "resource_tracker" not in " ".join(p.cmdline())]
        random.Random(rows).choice(workers).send_signal(signum)
    try:
        proc.wait(timeout=600)
        gone, alive = psutil.wait_procs(family, timeout=120)  # no worker outlives the sweep
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None or any(p.is_running() for p in family):
            os.killpg(proc.pid, signal.SIGKILL)
    return f"{name} to the {whom}"


def go_on(sweep_dir, discarded, max_rounds=4):
    """Run each job's next command, as `python -m jagg_lab.sweeps SWEEP_DIR` says, until every job
    has finished. Returns the lines said after the interruption."""
    first = sweep_report(sweep_dir, write=False)
    lines = first
    for _ in range(max_rounds):
        todo = [line for line in lines if " next: " in line]
        if not todo:
            return first
        for line in todo:
            said, command = line.split(" next: ", 1)
            if " out of the sweep directory" in said:  # killed before its first checkpoint: nothing to resume
                part = said.split("move ", 1)[1].split(" out of", 1)[0]
                shutil.move(part, discarded / f"{len(list(discarded.iterdir()))}")
            args = shlex.split(command)
            assert args[:3] == ["python", "-m", "jagg_lab.train"], line
            done = subprocess.run([sys.executable, *args[1:]], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, (line, done.stderr[-3000:])
        lines = sweep_report(sweep_dir, write=False)
    pytest.fail(f"still unfinished after {max_rounds} rounds: {lines}")


@pytest.mark.parametrize("trial", range(len(KILLS)))
def test_a_sweep_killed_at_a_random_point_resumes_every_job_to_the_uninterrupted_rows(tmp_path, straight, trial):
    name, whom = KILLS[trial]
    rows = random.Random(trial).randint(1, 3 * STEPS - 2)  # a point among the 18 steps of the sweep
    sweep_dir, discarded = tmp_path / "sweep", tmp_path / "discarded"
    discarded.mkdir()
    proc = start_sweep(sweep_dir)
    what = hit(sweep_dir, proc, name, whom, rows)
    left = go_on(sweep_dir, discarded)
    print(f"\n{what} after {rows} rows (exit {proc.returncode}): " + " | ".join(line.split(": ", 1)[1].split("; next")[0] for line in left))
    assert all(line.endswith(f"finished, {STEPS} steps") or f"finished, {STEPS} steps (its part" in line
               for line in sweep_report(sweep_dir, write=False))
    runs = load_runs(sweep_dir)
    assert sorted(run.config["seed"] for run in runs) == [0, 1, 2]  # one run per job, resumed parts joined
    for run in runs:
        pd.testing.assert_frame_equal(comparable(run), straight[run.config["seed"]], check_dtype=False, check_exact=True)
    for run_dir, _ in planned_jobs(sweep_dir).values():
        lasts = [part / "checkpoints" / "last.ckpt" for part in job_parts(run_dir) if (part / "checkpoints" / "last.ckpt").is_file()]
        final = [last for last in lasts if torch.load(last, map_location="cpu", weights_only=True)["global_step"] == STEPS]
        assert final == [job_parts(run_dir)[-1] / "checkpoints" / "last.ckpt"], lasts
