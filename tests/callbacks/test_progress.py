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
