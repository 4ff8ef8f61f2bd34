"""jagg_lab.sweeps: what a sweep says of each job, and the stop marker its further jobs obey
(the end-to-end Ctrl-C and hangup of a real local sweep: tests/test_interrupts.py, slow)."""
import json
import signal

from jagg_lab.sweeps import STOPPING, job_status, report_jobs, stop_on_signal, sweep_stopping


def test_each_job_is_finished_stopped_killed_or_never_started(tmp_path):
    finished, stopped, killed, never = (tmp_path / name for name in ("0", "1", "2", "3"))
    for run in (finished, stopped, killed):
        run.mkdir()
        (run / "metrics.csv").write_text("step\n1\n")
    (finished / "summary.json").write_text(json.dumps({"steps": 100, "interrupted": None}))
    (stopped / "summary.json").write_text(json.dumps({"steps": 7, "interrupted": "SIGINT",
                                                      "next": "python -m jagg_lab.train resume=R hydra.run.dir=NEW_DIR"}))
    lines = report_jobs(tmp_path, [finished, stopped, killed, never])
    assert lines == [f"{finished}: finished, 100 steps",
                     f"{stopped}: stopped by SIGINT after 7 steps; next: python -m jagg_lab.train resume=R hydra.run.dir=NEW_DIR",
                     f"{killed}: ended without a summary (killed?); see python -m jagg_lab.train's message for that directory",
                     f"{never}: never started"]
    assert (tmp_path / "jobs.txt").read_text().splitlines() == lines
    assert job_status(never) == lines[3]


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

    assert report_jobs(tmp_path, [tmp_path / "0"], [ValueError("grpo.block_size: bad\nmore")]) == [
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
