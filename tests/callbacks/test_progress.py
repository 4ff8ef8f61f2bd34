import logging

import pytest

from jagg_lab.callbacks import progress_line


def test_progress_line_counts_from_the_resumed_step_and_prints_a_readable_loss():
    # resumed at step 3 of 100, then 10 steps in 60 s: ETA = 6 s/step * 87 steps left
    line = progress_line(13, 100, 60.0, 10, 0.4531, -1.234e-5)
    assert line.startswith("step 13/100 [")
    assert "0:01:00 elapsed, ETA 0:08:42" in line and "6.00 s/step" in line
    assert "reward 0.453" in line and "loss -1.23e-05" in line and "Epoch" not in line


def test_progress_line_under_a_time_budget_takes_the_sooner_end():
    assert "ETA 0:00:30" in progress_line(5, 100, 50.0, 5, 0.5, 0.0, time_left_s=30.0)
    assert progress_line(5, None, 50.0, 5, 0.5, 0.0, time_left_s=30.0).startswith("step 5 |")


def test_the_rate_follows_the_recent_steps_so_a_pause_fades_out(caplog, monkeypatch):
    """10 steps of 2 s, a 300 s pause in step 11, then 10 more of 2 s: the line after the pause
    shows the pause's step, the line 10 steps later 2 s/step again (the mean since the start: ~16)."""
    from types import SimpleNamespace

    from jagg_lab.callbacks.progress import StepProgress

    clock = [1000.0]
    monkeypatch.setattr("jagg_lab.callbacks.progress.time.monotonic", lambda: clock[0])
    trainer = SimpleNamespace(global_step=0, max_steps=100, is_global_zero=True, callbacks=[],
                              callback_metrics={"reward": 0.5, "loss": 0.0})
    bar = StepProgress(interval_s=0)
    bar.on_train_start(trainer, None)
    caplog.set_level(logging.INFO)
    for step in range(1, 22):
        clock[0] += 302.0 if step == 11 else 2.0
        trainer.global_step = step
        bar.on_train_batch_end(trainer, None, None, None, step - 1)
    rates = [float(r.getMessage().split(" s/step")[0].rsplit("| ", 1)[1]) for r in caplog.records]
    assert rates[9] == pytest.approx(2.0) and rates[10] == pytest.approx(32.0)  # 10 steps, one of them the pause
    assert rates[20] == pytest.approx(2.0)  # the pause has left the window
    assert "ETA 0:02:38" in caplog.records[20].getMessage()  # 79 steps left at 2 s


def test_evaluation_progress_counts_samples_and_stops_when_asked(caplog):
    from jagg_lab.callbacks import SampleProgress, count_line

    assert count_line("held-out verdict", 128, 512, 31.0) == (
        "held-out verdict: 128/512 samples [#####---------------] 25% | 0:00:31 elapsed, ETA 0:01:33")
    caplog.set_level(logging.INFO)
    progress = SampleProgress("held-out verdict", 6, interval_s=0)
    for done in (2, 4, 6):
        progress(done)
    assert [r.getMessage().split(" [")[0] for r in caplog.records] == [f"held-out verdict: {n}/6 samples" for n in (2, 4, 6)]
    caplog.clear()
    SampleProgress("one batch", 4)(4)
    assert not caplog.records  # one batch: nothing to follow
    stopping = SampleProgress("held-out verdict", 6, should_stop=lambda: True, stop_error=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt, match="stopped after 2/6 samples"):
        stopping(2)
