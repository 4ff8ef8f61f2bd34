"""experiments/bias_map.py: the window noise span, one row per window with JAGG beside subsample,
and an output directory that is never overwritten."""
import json

import pytest

from tests.scripts import load_script


def _row(strategy, window, z=1.0, rel_error=0.5):
    summary = {} if strategy == "full" else {
        "z": z, "halves_cosine": 0.1, "bias_over_mean_full": 0.3, "mean_cosine": 0.9, "per_rollout_cosine": 0.95,
        "rel_error": rel_error, "z_full": 1.1}
    return {"strategy": strategy, "window": window, "backward_items_per_rollout": 8.0 if window > 1 else 12.0, **summary}


def _report(num_steps=10, trained=6, windows=(4, 6)):
    rows = [_row("full", 1)] + [row for w in windows for row in (_row("jagg", w, z=5.0 + w), _row("subsample", w, rel_error=0.7))]
    return {"setting": {"sampler": {"num_steps": num_steps, "shift": 1.0}, "trained_steps": list(range(trained))},
            "rollouts_done": 12, "rows": rows}


def test_the_window_span_counts_leftover_windows_by_their_steps(monkeypatch):
    bias_map = load_script("bias_map", monkeypatch)
    # 10 steps, first 6 trained, W = 4: [0..3] spans 0.3, [4, 5] spans 0.1; weighted (4 * 0.3 + 2 * 0.1) / 6
    assert bias_map.window_span(10, 1.0, list(range(6)), 4) == pytest.approx((4 * 0.3 + 2 * 0.1) / 6)
    assert bias_map.window_span(20, 1.0, list(range(20)), 5) == pytest.approx(0.2)
    assert bias_map.window_span(10, 1.0, list(range(6)), 1) == 0.0  # every step exact
    # a shifted grid: the high-noise windows are narrower
    assert bias_map.window_span(10, 3.0, list(range(6)), 2) < bias_map.window_span(10, 1.0, list(range(6)), 2)


def test_the_bias_in_units_of_fs_noise_does_not_grow_with_the_rollouts(monkeypatch):
    bias_map = load_script("bias_map", monkeypatch)
    # |E d|^2 = 0.04, tr Cov d = 1: E |d|^2 = 1.04; f's noise 2, so the error is sqrt(1.04) / 2 and the bias 0.2 / 2
    error = 1.04 ** 0.5 / 2
    for n in (16, 64):  # z - 1 = n |E d|^2 / tr Cov d grows with n; the estimate does not
        assert bias_map.bias_over_noise(1 + n * 0.04, n, error) == pytest.approx(0.1)
    assert bias_map.bias_over_noise(0.9, 32, 0.5) == 0.0  # z below 1: no bias seen


def test_rows_pair_jagg_with_subsample_and_the_outputs_are_written_once(monkeypatch, tmp_path, capsys):
    bias_map = load_script("bias_map", monkeypatch)
    rows = bias_map.map_rows(_report(), "steps10")
    assert [(r["window"], r["jagg_z"], r["subsample_rel_error"]) for r in rows] == [(4, 9.0, 0.7), (6, 11.0, 0.7)]
    results = tmp_path / "results"
    results.mkdir()
    (results / "steps10.json").write_text(json.dumps(_report()))
    (results / "steps20.json").write_text(json.dumps(_report(20, 12, (3, 5))))
    out = tmp_path / "map"
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(_report(40, 24, (8,))))
    assert bias_map.main([f"results={results}", f"out={out}", f"extra=[steps40={earlier}]"]) == 0
    written = json.loads((out / "map.json").read_text())["rows"]
    assert [(r["column"], r["window"]) for r in written] == [("steps10", 4), ("steps10", 6), ("steps20", 3), ("steps20", 5),
                                                             ("steps40", 8)]
    assert (out / "map.png").stat().st_size > 1000 and "| steps20 | 20 | 12 | 5 |" in (out / "map.md").read_text()
    capsys.readouterr()
    assert bias_map.main([f"results={results}", f"out={out}"]) == 2  # never overwritten
    assert "already exists" in capsys.readouterr().err
    assert bias_map.main([f"results={results}", f"out={tmp_path / 'other'}", "extra=[nofile]"]) == 2
    assert "extra" in capsys.readouterr().err
