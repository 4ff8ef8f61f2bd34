"""experiments/memory.py: growth of resident memory over a run's last steps, robust to the
allocator's step-to-step swings, against a stated bound; bad inputs refused before writing."""
import json

import numpy as np
import pytest

from tests.scripts import load_script


def _run(path, rss):
    path.mkdir(parents=True)
    (path / "metrics.csv").write_text("step,memory_rss_mib\n" + "".join(f"{i + 1},{v}\n" for i, v in enumerate(rss)))
    return path


def test_a_leak_fails_and_a_swinging_flat_run_passes(tmp_path, monkeypatch):
    memory = load_script("memory", monkeypatch)
    swings = 1200 + 150 * (np.random.default_rng(0).random(300) < 0.5)  # the allocator keeps or returns blocks
    flat = _run(tmp_path / "flat", swings)
    leak = _run(tmp_path / "leak", swings + np.arange(300) * 0.5)  # 100 MiB over the last 200 steps
    assert memory.main([f"runs=[{flat},{leak}]", f"out={tmp_path / 'out'}"]) == 1
    report = {r["run"].rsplit("/", 1)[-1]: r for r in json.loads((tmp_path / "out" / "memory.json").read_text())["runs"]}
    assert report["flat"]["within_bound"] and abs(report["flat"]["tail_growth_mib"]) < 50
    assert not report["leak"]["within_bound"] and report["leak"]["tail_growth_mib"] == pytest.approx(90, abs=40)
    assert report["leak"]["slope_mib_per_100_steps"] == pytest.approx(50, abs=15)
    assert (tmp_path / "out" / "memory.png").is_file() and "FAIL" in (tmp_path / "out" / "memory.md").read_text()


def test_a_run_without_the_memory_column_or_an_existing_output_is_refused(tmp_path, capsys, monkeypatch):
    memory = load_script("memory", monkeypatch)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("step,loss\n1,0.0\n")
    assert memory.main([f"runs=[{run}]", f"out={tmp_path / 'out'}"]) == 2
    assert "no memory_rss_mib column (train with log_memory=true)" in capsys.readouterr().err
    (tmp_path / "out").mkdir()
    flat = _run(tmp_path / "flat", [1000] * 10)
    assert memory.main([f"runs=[{flat}]", f"out={tmp_path / 'out'}", "tail=4", "ends=2"]) == 2
    assert "already exists" in capsys.readouterr().err
