"""Run summaries: training time with diagnostics removed, equal-time cuts, mean and std over seeds."""
from pathlib import Path

import pandas as pd
import pytest

from jagg_lab.evaluation.runs import aggregate, load_run, summarize


def fake_run(path: Path, seed: int, window: int, rewards: list[float], gradient_s: list[float], cosines=None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"seed: {seed}\nstrategy:\n  window: {window}\ndata:\n  seed: {seed}\n")
    metrics = pd.DataFrame({"step": range(1, len(rewards) + 1), "reward_mean": rewards, "time_rollout_s": 1.0,
                            "time_reward_s": 0.0, "time_gradient_s": gradient_s})
    if cosines is not None:
        metrics["grad_cosine"] = cosines
    metrics.to_csv(path / "metrics.csv", index=False)
    return path


def test_summaries_correct_diagnostic_time_and_cut_at_equal_time(tmp_path):
    # Row 1 ran the gradient diagnostic (10 s instead of 2 s): counted at the median of the others.
    run = load_run(fake_run(tmp_path / "a", 0, 4, [0.0, 0.1, 0.2, 0.3, 0.4], [10.0, 2.0, 2.0, 2.0, 2.0],
                            cosines=[0.9, None, None, None, None]))
    assert run.metrics["time_s"].tolist() == [3.0, 6.0, 9.0, 12.0, 15.0]
    assert run.metrics["trained_s"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
    row = summarize(run, tail_frac=0.4, at_time=6.0)
    assert row["reward_final"] == pytest.approx(0.35)  # last 2 of 5 steps
    assert row["reward_at_time"] == pytest.approx(0.15)  # policies trained <= 6 s: steps 1-3, the last 2 of them
    assert row["grad_cosine"] == pytest.approx(0.9) and row["time_gradient_s"] == pytest.approx(2.0)


def test_aggregate_gives_mean_and_sample_std_over_seeds(tmp_path):
    runs = [load_run(fake_run(tmp_path / f"r{s}", s, 4, [r, r], [1.0, 1.0])) for s, r in ((0, 0.2), (1, 0.4), (2, 0.9))]
    table = pd.DataFrame([{"label": "w4", **summarize(r, tail_frac=1.0)} for r in runs])
    groups = aggregate(table, ["reward_final", "missing_column"])
    assert groups["n_runs"].tolist() == [3] and "missing_column_mean" not in groups
    assert groups["reward_final_mean"][0] == pytest.approx(0.5)
    assert groups["reward_final_std"][0] == pytest.approx(pd.Series([0.2, 0.4, 0.9]).std(ddof=1))
