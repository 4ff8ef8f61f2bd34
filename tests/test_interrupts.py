"""Runs that are interrupted or killed lose nothing: `last.ckpt` is always the latest step, an
interrupt after the last step still leaves the policy, `last.ckpt` and a summary naming what is
unfinished, a run killed at any point resumes from its latest complete checkpoint to the rows of
an uninterrupted run, and the directory it leaves is recognised by the next command.

The faults are injected by `python -m tests.faults` (a signal at a chosen point of the run)."""
import json
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from jagg_lab.callbacks.interrupt import SafeStop
from jagg_lab.evaluate import main as evaluate
from jagg_lab.evaluation import find_run
from jagg_lab.rundir import ConfigError, check_fresh_run_dir, unfinished_run
from tests.test_train_cli import REPO, read_rows, train

SMALL = ["policy=dit_xs", "data.prompts_per_step=1", "data.group_size=4", "grpo.micro_batch_size=2", "sampler.num_steps=4",
         "reward=jpeg", "optimizer.lr=1e-3", "heldout.n_samples=0", "sample_every=0"]
HELDOUT = ["heldout.n_samples=4", "heldout.num_steps=2", "heldout.batch_size=2", "heldout.every=0",
           "heldout.final_n_samples=6", "heldout.final_seed=3"]  # held-out work only at the end: a check and a verdict
EVERY_STEP = "checkpoint_every_minutes=0.000001"  # the wall-time writer of last.ckpt fires at every step


def faulty(point, nth, name, *overrides):
    return subprocess.run([sys.executable, "-m", "tests.faults", point, str(nth), name, *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def step_in(path):
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def same_rows(rows, reference):
    keys = [k for k in reference[0] if not k.startswith("time_")]
    return [{k: r[k] for k in keys} for r in rows] == [{k: r[k] for k in keys} for r in reference]


def test_last_ckpt_is_the_latest_step_across_timer_periodic_and_interrupt_writes(tmp_path):
    """Timer writes at every step, a periodic checkpoint at step 2, SIGINT during step 3: one
    last.ckpt, of step 3 (it was last-v1.ckpt when two writers shared the name)."""
    run = tmp_path / "run"
    proc = faulty("rollout", 3, "INT", *SMALL, "trainer.max_steps=5", "checkpoint_every=2", EVERY_STEP,
                  f"hydra.run.dir={run}")
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt", "step_000002.ckpt"]
    assert step_in(run / "checkpoints" / "last.ckpt") == 3 == len(read_rows(run / "metrics.csv"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and f"resume={run / 'checkpoints' / 'last.ckpt'}" in summary["next"]


def test_an_interrupt_during_the_verdict_keeps_the_policy_and_says_what_is_left(tmp_path):
    run = tmp_path / "run"
    proc = faulty("verdict", 1, "INT", *[o for o in SMALL if not o.startswith("heldout.")], *HELDOUT,
                  "trainer.max_steps=3", "checkpoint_every=2", f"hydra.run.dir={run}")
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr[-3000:]
    assert "held-out verdict: 2/6 samples" in proc.stderr + proc.stdout  # progress, then the stop
    assert (run / "policy.safetensors").is_file() and not (run / "heldout_final.json").exists()
    assert step_in(run / "checkpoints" / "last.ckpt") == 3
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["interrupted"] == "SIGINT" and summary["unfinished"] == ["held-out verdict"]
    command = shlex.split(summary["next"])
    assert command[:3] == ["python", "-m", "jagg_lab.evaluate"] and "n_samples=6" in command and "seed=3" in command
    assert f"base={run / 'checkpoints' / 'last.ckpt'}" in command  # it grades against the base's stored scores
    assert evaluate([*command[3:], f"out={tmp_path / 'verdict.json'}"]) == 0  # the command finishes it
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["args"]["n_samples"] == 6
    gain = verdict["gain_over_base"]  # as the run itself would have reported it: paired, over the base
    assert set(gain) >= {"dense_gain", "dense_gain_se", "strict_gain", "strict_gain_se"}
    states = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["callbacks"].values()
    base = next(state["final_base"] for state in states if isinstance(state, dict) and state.get("final_base"))
    assert gain["dense_gain"] == pytest.approx(verdict["dense_score"] - base["dense_score"])
    assert gain["strict_gain"] == pytest.approx(verdict["strict_accuracy"] - base["strict_accuracy"])
    # another set is refused naming the base file, not graded against the wrong scores
    assert evaluate([*[a for a in command[3:] if not a.startswith("seed=")], "seed=99"]) == 2


@pytest.mark.parametrize("heldout,left", [([], []), (HELDOUT, ["end-of-run held-out evaluation", "held-out verdict"])])
def test_a_signal_during_the_last_step_leaves_a_finished_run_that_names_what_it_left(tmp_path, heldout, left):
    run = tmp_path / "run"
    proc = faulty("rollout", 2, "TERM", *[o for o in SMALL if not (heldout and o.startswith("heldout."))], *heldout,
                  "trainer.max_steps=2", f"hydra.run.dir={run}")
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["interrupted"] == "SIGTERM" and summary["unfinished"] == left
    assert "resume=" not in summary["next"] and (run / "policy.safetensors").is_file()
    assert "after its last step" in unfinished_run(run)


def test_a_hangup_stops_a_run_as_sigterm_does_resumable_with_a_summary(tmp_path):
    """SIGHUP (the terminal closed, an ssh session dropped) during step 2 of 4: the step finishes,
    last.ckpt and the summary say where to go on, as after SIGTERM."""
    run = tmp_path / "run"
    proc = faulty("rollout", 2, "HUP", *SMALL, "trainer.max_steps=4", f"hydra.run.dir={run}")
    assert proc.returncode == 128 + signal.SIGHUP, proc.stderr[-3000:]
    assert step_in(run / "checkpoints" / "last.ckpt") == 2 == len(read_rows(run / "metrics.csv"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] == "SIGHUP" and f"resume={run / 'checkpoints' / 'last.ckpt'}" in summary["next"]


def test_a_run_killed_while_writing_last_ckpt_resumes_exactly_and_is_recognised(tmp_path):
    killed, resumed = tmp_path / "killed", tmp_path / "resumed"
    proc = faulty("last_write", 3, "KILL", *SMALL, "trainer.max_steps=3", "checkpoint_every=2", EVERY_STEP,
                  f"hydra.run.dir={killed}")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    last = killed / "checkpoints" / "last.ckpt"
    assert step_in(last) == 2  # the write of step 3 was cut: step 2's stays whole
    straight = read_rows(killed / "metrics.csv")  # logged before the kill: an uninterrupted run's
    assert len(straight) == 3
    # the next command that meets the directory says what it is and how to go on
    with pytest.raises(ConfigError, match=f"was killed .*resume={last} hydra.run.dir=NEW_DIR"):
        check_fresh_run_dir(killed)
    with pytest.raises(FileNotFoundError, match=f"was killed.*run={last}"):
        find_run(killed)  # python -m jagg_lab.evaluate run=KILLED
    train(*SMALL, "trainer.max_steps=3", "checkpoint_every=2", f"resume={last}", f"hydra.run.dir={resumed}")
    rows = read_rows(resumed / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [3] and same_rows(rows, straight[2:])


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    train(*SMALL, "trainer.max_steps=4", "checkpoint_every=2", EVERY_STEP, f"hydra.run.dir={run}")
    return read_rows(run / "metrics.csv")


# (point, nth time there): a rollout, a gradient pass (2 micro-batches a step), last.ckpt and a periodic
# checkpoint half written (step_000002.ckpt, after last.ckpt of step 2), in steps 2 to 4.
KILLS = [("rollout", 3), ("gradient", 6), ("last_write", 4), ("periodic_write", 1), ("rollout", 4), ("gradient", 7)]


@pytest.mark.slow
@pytest.mark.parametrize("point,nth", KILLS)
def test_a_run_killed_anywhere_resumes_from_its_latest_checkpoint_to_the_uninterrupted_rows(tmp_path, straight, point, nth):
    killed, resumed = tmp_path / "killed", tmp_path / "resumed"
    proc = faulty(point, nth, "KILL", *SMALL, "trainer.max_steps=4", "checkpoint_every=2", EVERY_STEP,
                  f"hydra.run.dir={killed}")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    last = killed / "checkpoints" / "last.ckpt"
    step = step_in(last)  # the latest complete checkpoint loads
    done = read_rows(killed / "metrics.csv")
    assert same_rows(done, straight[: len(done)]) and step in (len(done), len(done) - 1)
    train(*SMALL, "trainer.max_steps=4", "checkpoint_every=2", EVERY_STEP, f"resume={last}", f"hydra.run.dir={resumed}")
    rows = read_rows(resumed / "metrics.csv")
    assert [int(r["step"]) for r in rows] == list(range(step + 1, 5)) and same_rows(rows, straight[step:])


def _worker(out: str, method: str) -> None:
    """A sweep's worker as SafeStop sees it: watching from train start, quiet while the process
    that started it lives, then stopped by its own handler; writes what it saw to OUT/result."""
    if method == "loky":
        multiprocessing.parent_process()._sentinel = None  # a loky worker's parent has no sentinel
    SafeStop.POLL_S = 0.02
    stop = SafeStop(out)
    stop.on_train_start(None, None)
    time.sleep(0.3)  # 15 looks at a live parent
    quiet = stop.signal is None
    Path(out, "watching").touch()
    deadline = time.monotonic() + 30
    while stop.signal is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs in the main thread, between these sleeps
    stop.teardown(None, None, "fit")
    Path(out, "result").write_text(json.dumps([quiet, stop.signal, stop.orphaned, signal.getsignal(signal.SIGTERM) is stop._handle]))


def _sweep(out: str, method: str) -> None:
    """Starts a worker, then ends without waiting for it, as a killed sweep."""
    context = multiprocessing.get_context("fork" if method == "loky" else method)
    context.Process(target=_worker, args=(out, method)).start()
    deadline = time.monotonic() + 30
    while not Path(out, "watching").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0)


@pytest.mark.parametrize("method", ["fork", "forkserver", "loky"])
def test_a_worker_whose_starting_process_ends_stops_as_on_sigterm(tmp_path, method):
    """Real processes: parents with a sentinel (fork; forkserver, whose workers' parent id is the
    fork server's) and one without (loky, Hydra's joblib launcher: its worker is handed to
    another parent when it ends)."""
    sweep = multiprocessing.get_context("fork").Process(target=_sweep, args=(str(tmp_path), method))
    sweep.start()
    sweep.join(60)
    result, deadline = tmp_path / "result", time.monotonic() + 60
    while not result.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)  # written whole
    quiet, stopped_by, orphaned, handler_kept = json.loads(result.read_text())
    assert quiet and stopped_by == signal.SIGTERM and orphaned
    assert not handler_kept  # teardown stopped the watcher, then restored the handlers


def test_safestop_pickles_before_training():
    """strategy=ddp_spawn pickles the trainer's callbacks: the watcher is made at train start."""
    import pickle
    stop = pickle.loads(pickle.dumps(SafeStop("ckpts")))
    assert stop._watcher is None and stop.stop_with_parent


@pytest.mark.slow
def test_killing_a_local_sweep_stops_every_job_cleanly_and_leaves_no_worker(tmp_path):
    """`kill PID` of a `--multirun hydra/launcher=local` sweep reaches only its own process; its
    joblib workers see it gone, finish their step, write last.ckpt and the policy, and exit."""
    psutil = pytest.importorskip("psutil")
    sweep = tmp_path / "sweep"
    parent = subprocess.Popen([sys.executable, "-m", "jagg_lab.train", "--multirun", "hydra/launcher=local", *SMALL,
                               "seed=0,1", "trainer.max_steps=100000", f"hydra.sweep.dir={sweep}"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not all((sweep / job / "metrics.csv").is_file() for job in ("0", "1")):  # both jobs are training
            assert parent.poll() is None and time.monotonic() < deadline, "the sweep did not start both jobs"
            time.sleep(0.5)
        workers = psutil.Process(parent.pid).children(recursive=True)
        parent.terminate()
        parent.wait(30)
        gone, alive = psutil.wait_procs(workers, timeout=120)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if parent.poll() is None:
            parent.kill()
    for job in ("0", "1"):
        run = sweep / job
        summary = json.loads((run / "summary.json").read_text())
        assert summary["interrupted"] == "SIGTERM" and (run / "policy.safetensors").is_file()
        assert step_in(run / "checkpoints" / "last.ckpt") == summary["steps"] == len(read_rows(run / "metrics.csv")) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name, n_jobs", [("INT", 2), ("HUP", 2), ("INT", 1)])
def test_ctrl_c_or_a_hangup_of_a_local_sweep_stops_every_job_cleanly_and_says_what_each_left(tmp_path, name, n_jobs):
    """The terminal's Ctrl-C (SIGINT to the sweep's whole process group) or its hangup: the running
    jobs finish their step and write last.ckpt and a summary, the queued jobs never start, the sweep
    waits for them (joblib would kill them mid-step), lists every job in jobs.txt and exits 128 + signal.
    With n_jobs=1 the job runs in the sweep's own process and meets the signal first."""
    psutil = pytest.importorskip("psutil")
    signum = getattr(signal, f"SIG{name}")
    sweep = tmp_path / "sweep"
    running = [str(j) for j in range(n_jobs)]
    parent = subprocess.Popen([sys.executable, "-m", "jagg_lab.train", "--multirun", "hydra/launcher=local", *SMALL,
                               f"hydra.launcher.n_jobs={n_jobs}",
                               "seed=0,1,2", "trainer.max_steps=100000", f"hydra.sweep.dir={sweep}"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # its own process group, as a terminal gives it
    try:
        deadline = time.monotonic() + 300
        while not all((sweep / job / "metrics.csv").is_file() for job in running):  # every worker is training
            assert parent.poll() is None and time.monotonic() < deadline, "the sweep did not start its jobs"
            time.sleep(0.5)
        workers = psutil.Process(parent.pid).children(recursive=True)
        os.killpg(parent.pid, signum)
        _, err = parent.communicate(timeout=240)
        gone, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 128 + signum, err[-3000:]
    lines = (sweep / "jobs.txt").read_text().splitlines()
    assert len(lines) == 3, lines
    for j, line in enumerate(lines[n_jobs:], n_jobs):  # with the command that starts it
        assert line.startswith(f"{sweep / str(j)}: never started; next: python -m jagg_lab.train ") and \
            line.endswith(f"seed={j} trainer.max_steps=100000 hydra.run.dir={sweep / str(j)}"), line
    for job, line in zip(running, lines):
        run = sweep / job
        summary = json.loads((run / "summary.json").read_text())
        assert summary["interrupted"] == f"SIG{name}" and (run / "policy.safetensors").is_file()
        assert step_in(run / "checkpoints" / "last.ckpt") == summary["steps"] == len(read_rows(run / "metrics.csv")) > 0
        assert line.startswith(f"{run}: stopped by SIG{name}") and f"resume={run / 'checkpoints' / 'last.ckpt'}" in line
    assert not (sweep / "2" / "metrics.csv").exists() and not (sweep / ".stopping").exists()

