"""jagg_lab.sweeps: what a sweep says of each job, and the stop marker its further jobs obey
(the end-to-end Ctrl-C and hangup of a real local sweep: tests/test_interrupts.py, slow)."""
import json
import signal

from jagg_lab.sweeps import STOPPING, job_status, plan_jobs, stop_on_signal, sweep_report, sweep_stopping
from jagg_lab.sweeps import main as sweeps_main


def test_each_job_is_finished_stopped_killed_or_never_started_with_the_command_that_goes_on(tmp_path):
    overrides = ["policy=dit_xs", "seed=1"]
    plan_jobs(tmp_path, {i: (str(i), overrides) for i in range(6)})
    finished, stopped, killed, never, early, resumed = (tmp_path / str(i) for i in range(6))
    for run in (finished, stopped, killed, early, resumed, tmp_path / "5_resumed1"):
        (run / "checkpoints").mkdir(parents=True)
        (run / "metrics.csv").write_text("step\n1\n")
        if run is not early:
            (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (finished / "summary.json").write_text(json.dumps({"steps": 100, "interrupted": None}))
    (stopped / "summary.json").write_text(json.dumps({"steps": 7, "interrupted": "SIGINT"}))
    (tmp_path / "5_resumed1" / "summary.json").write_text(json.dumps({"steps": 9, "interrupted": "SIGTERM"}))
    lines = sweep_report(tmp_path)
    train = "python -m jagg_lab.train policy=dit_xs seed=1"
    assert lines == [
        f"{finished}: finished, 100 steps",
        f"{stopped}: stopped by SIGINT after 7 steps; next: {train} resume={stopped}/checkpoints/last.ckpt hydra.run.dir={stopped}_resumed1",
        f"{killed}: ended without a summary (killed, or still running); next: {train} resume={killed}/checkpoints/last.ckpt "
        f"hydra.run.dir={killed}_resumed1",
        f"{never}: never started; next: {train} hydra.run.dir={never}",
        f"{early}: ended without a summary (killed, or still running) before its first checkpoint (nothing to resume in it): "
        f"move {early} out of the sweep directory, then next: {train} hydra.run.dir={early}",
        f"{resumed}: stopped by SIGTERM after 9 steps (its part 5_resumed1); next: {train} resume={resumed}_resumed1/checkpoints/last.ckpt "
        f"hydra.run.dir={resumed}_resumed2"]
    assert (tmp_path / "jobs.txt").read_text().splitlines() == lines
    (resumed / "checkpoints" / "last.ckpt").unlink()
    (tmp_path / "5_resumed1" / "summary.json").unlink()
    (tmp_path / "5_resumed1" / "checkpoints" / "last.ckpt").unlink()  # the resumption was killed before its first checkpoint
    assert job_status(resumed, overrides).endswith(
        f"move {resumed}_resumed1 out of the sweep directory, then next: {train} resume={resumed}/checkpoints/last.ckpt "
        f"hydra.run.dir={resumed}_resumed1")


def test_the_status_command_reads_a_sweep_whose_process_was_killed(tmp_path, capsys):
    """No jobs.txt (the sweep's process died before writing it): the plan says what the jobs were."""
    assert sweeps_main([str(tmp_path)]) == 2 and "not a local sweep's directory (no jobs.json" in capsys.readouterr().err
    plan_jobs(tmp_path, {0: ("0", ["seed=0"])})
    plan_jobs(tmp_path, {1: ("1", ["seed=1"])})  # a later batch of the same sweep
    assert sweeps_main([str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"{tmp_path / '1'}: never started; next: python -m jagg_lab.train seed=1 hydra.run.dir={tmp_path / '1'}"
    assert out[-1] == "2 jobs: 0 finished, 2 to go on with (run each line's next command)" and not (tmp_path / "jobs.txt").exists()


def test_the_first_signal_marks_the_sweep_stopping_and_the_mark_goes_with_the_sweep(tmp_path):
    job = tmp_path / "0"
    with stop_on_signal(tmp_path) as stopped:
        assert not sweep_stopping(job)
        signal.raise_signal(signal.SIGHUP)
        assert stopped == [signal.SIGHUP] and sweep_stopping(job) and (tmp_path / STOPPING).is_file()
        signal.raise_signal(signal.SIGHUP)  # a second hangup changes nothing
        assert stopped == [signal.SIGHUP]
    assert not (tmp_path / STOPPING).exists() and signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


def test_a_failed_job_says_why_and_a_job_of_the_sweeps_own_process_marks_it_stopping(tmp_path):
    from jagg_lab.sweeps import mark_sweep_stopping, stopping_signal

    plan_jobs(tmp_path, {0: ("0", ["seed=0"])})
    assert sweep_report(tmp_path, {0: ValueError("grpo.block_size: bad\nmore")}) == [
        f"{tmp_path / '0'}: failed: ValueError: grpo.block_size: bad"]
    with stop_on_signal(tmp_path) as stopped:  # n_jobs=1: the job's own handler met Ctrl-C, not the sweep's
        mark_sweep_stopping(tmp_path / "0", signal.SIGINT)
        assert sweep_stopping(tmp_path / "1") and stopping_signal(tmp_path) == signal.SIGINT
    assert stopped == [signal.SIGINT] and not (tmp_path / STOPPING).exists()


def test_an_ignored_hangup_stays_ignored_for_the_sweep_and_its_idle_workers(tmp_path):
    from jagg_lab.sweeps import idle_worker_ignores_signals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    try:
        with stop_on_signal(tmp_path):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        idle_worker_ignores_signals()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        idle_worker_ignores_signals()  # a worker between jobs: the signal passes, the worker lives
        signal.raise_signal(signal.SIGHUP)
    finally:
        signal.signal(signal.SIGHUP, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
