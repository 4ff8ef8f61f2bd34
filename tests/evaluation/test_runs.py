"""Run summaries: training time with diagnostics removed, equal-time cuts, mean and std over seeds."""
from pathlib import Path

import pandas as pd
import pytest

from jagg_lab.evaluation.runs import aggregate, load_run, load_runs, markdown_table, summarize


def fake_run(path: Path, seed: int, window: int, rewards: list[float], gradient_s: list[float], cosines=None,
             first_step: int = 1, resume: str | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"seed: {seed}\nstrategy:\n  window: {window}\ndata:\n  seed: {seed}\n"
                                      f"resume: {resume or 'null'}\n")
    metrics = pd.DataFrame({"step": range(first_step, first_step + len(rewards)), "reward_mean": rewards, "time_rollout_s": 1.0,
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


def test_a_run_resumed_into_new_directories_is_one_run_cut_where_each_part_begins(tmp_path):
    # `a` was killed after step 5 with its last checkpoint at step 3; `a_resumed1` trained 4-6 again
    # from it, was killed, `a_resumed2` was killed before a step and `a_resumed3` went on from `a_resumed1`'s step 6. Their resume paths are relative
    # to where training ran (tmp_path), as the command line gave them.
    root = tmp_path / "outputs" / "sweep"
    fake_run(root / "a", 0, 4, [0.1, 0.2, 0.3, 0.9, 0.9], [1.0] * 5)
    fake_run(root / "a_resumed1", 0, 4, [0.4, 0.5, 0.6], [2.0] * 3, first_step=4,
             resume="outputs/sweep/a/checkpoints/last.ckpt")
    fake_run(root / "a_resumed2", 0, 4, [], [], resume="outputs/sweep/a_resumed1/checkpoints/last.ckpt")  # killed at once
    fake_run(root / "a_resumed3", 0, 4, [0.7], [3.0], first_step=7, resume="outputs/sweep/a_resumed1/checkpoints/last.ckpt")
    pd.DataFrame({"step": [2, 4], "strict_gain": [0.1, 0.9]}).to_csv(root / "a" / "heldout.csv", index=False)
    pd.DataFrame({"step": [6], "strict_gain": [0.3]}).to_csv(root / "a_resumed1" / "heldout.csv", index=False)
    (root / "a_resumed3" / "eval.json").write_text('{"strict_accuracy": 0.5}')
    fake_run(root / "b", 1, 4, [0.2, 0.3], [1.0, 1.0])  # another seed, not resumed

    runs = load_runs(root)
    assert [r.path.name for r in runs] == ["a", "b"]
    run = runs[0]
    assert run.metrics["step"].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert run.metrics["reward_mean"].tolist() == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    assert run.metrics["time_s"].tolist() == [2.0, 4.0, 6.0, 9.0, 12.0, 15.0, 19.0]
    assert run.heldout["step"].tolist() == [2, 6] and run.eval == {"strict_accuracy": 0.5}
    assert run.config["resume"] is None  # a swept key only where the first parts differ


def test_two_runs_resumed_from_one_checkpoint_are_branches_not_parts(tmp_path):
    fake_run(tmp_path / "a", 0, 4, [0.1, 0.2], [1.0, 1.0])
    for name in ("lr_low", "lr_high"):
        fake_run(tmp_path / name, 0, 4, [0.3], [1.0], first_step=3, resume=str(tmp_path / "a" / "checkpoints" / "last.ckpt"))
    runs = load_runs(tmp_path)
    assert sorted(r.path.name for r in runs) == ["a", "lr_high", "lr_low"]
    assert all(len(r.metrics) == (2 if r.path.name == "a" else 1) for r in runs)


def test_aggregate_gives_mean_and_sample_std_over_seeds(tmp_path):
    runs = [load_run(fake_run(tmp_path / f"r{s}", s, 4, [r, r], [1.0, 1.0])) for s, r in ((0, 0.2), (1, 0.4), (2, 0.9))]
    table = pd.DataFrame([{"label": "w4", **summarize(r, tail_frac=1.0)} for r in runs])
    groups = aggregate(table, ["reward_final", "missing_column"])
    assert groups["n_runs"].tolist() == [3] and "missing_column_mean" not in groups
    assert groups["reward_final_mean"][0] == pytest.approx(0.5)
    assert groups["reward_final_std"][0] == pytest.approx(pd.Series([0.2, 0.4, 0.9]).std(ddof=1))


def test_heldout_evaluations_and_the_verdict_are_summarised_and_plotted(tmp_path):
    import json
    import subprocess
    import sys

    from tests.test_train_cli import REPO

    for seed, gains in ((0, [0.0, 0.05, 0.02]), (1, [0.0, 0.03, 0.04])):
        path = fake_run(tmp_path / "runs" / f"r{seed}", seed, 6, [0.5, 0.6, 0.7], [1.0, 1.0, 1.0])
        pd.DataFrame({"step": [0, 50, 100], "strict_accuracy": [0.3 + g for g in gains],
                      "dense_score": [0.6 + g for g in gains], "strict_gain": gains, "strict_gain_se": 0.01,
                      "dense_gain": gains, "dense_gain_se": 0.01}).to_csv(path / "heldout.csv", index=False)
        (path / "heldout_final.json").write_text(json.dumps({"step": 100, "run_steps": 100, "strict_gain": gains[-1] / 2,
                                                             "dense_gain": 0.01, "final": {"per_sample": {}}}))
    row = summarize(load_run(tmp_path / "runs" / "r0"))
    assert (row["heldout_step"], row["heldout_strict_gain"]) == (100, 0.02)
    assert (row["heldout_best_step"], row["heldout_best_dense_gain"]) == (50, 0.05)  # best by dense_score
    assert row["verdict_strict_gain"] == 0.01 and row["verdict_step"] == 100 and "verdict_final" not in row

    out = tmp_path / "collated"
    proc = subprocess.run([sys.executable, "experiments/collate.py", f"runs={tmp_path / 'runs'}", f"out={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = pd.read_csv(out / "groups.csv")
    assert groups["verdict_strict_gain_mean"][0] == pytest.approx(0.015) and groups["heldout_best_step_mean"][0] == 75
    assert (out / "heldout_vs_step.png").stat().st_size > 0


def test_markdown_table_keeps_small_values_apart():
    # a learning-rate column: 5e-05 and 1e-4 must not both print as 0.0001
    table = pd.DataFrame({"lr": [5e-05, 1e-4, 0.5], "kl": [0.0, float("nan"), 0.0055123]})
    rows = markdown_table(table).splitlines()[2:]
    assert rows == ["| 5e-05 | 0.0000 |", "| 0.0001 | - |", "| 0.5000 | 0.005512 |"]
