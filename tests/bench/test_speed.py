"""`python -m jagg_lab.bench speed`: the speed table of issue #5, on a tiny setting."""
import csv
import json

import pytest
import torch

from jagg_lab.bench.__main__ import main
from jagg_lab.bench.speed import parse_args, peak_memory_mib
from jagg_lab.policies import DiTPolicy
from jagg_lab.strategies import partition_windows

TINY = ["sizes=[XS]", "resolutions=[16]", "prompts=2", "group_size=2", "num_steps=8", "repeats=1", "warmup=0"]
TRAINED = 8  # num_steps=8, train_fraction=1.0


@pytest.fixture(scope="module")
def speed(tmp_path_factory):
    out = tmp_path_factory.mktemp("speed")  # exists and is empty: accepted
    assert main(["speed", *TINY, f"out={out}"]) == 0
    report = json.loads((out / "speed.json").read_text())
    return out, report, {(r["strategy"], r["window"]): r for r in report["rows"]}


def test_speed_writes_one_row_per_configuration(speed):
    out, report, rows = speed
    assert set(rows) == {("full", 1), ("jagg", 2), ("jagg", 4), ("jagg", 8), ("subsample", 4)}
    assert all(r["size"] == "XS" and r["resolution"] == 16 and r["weights"].startswith("random") for r in rows.values())
    assert rows[("jagg", 4)]["mode"] == "cached" and rows[("subsample", 4)]["mode"] == "-"
    with open(out / "speed.csv") as f:
        assert [(r["strategy"], int(r["window"])) for r in csv.DictReader(f)] == [(r["strategy"], r["window"]) for r in report["rows"]]
    table_lines = [line for line in (out / "speed.md").read_text().splitlines() if line.startswith("| XS | 16 |")]
    assert len(table_lines) == 5
    assert report["machine"]["torch"] == torch.__version__ and report["machine"]["cpu_count"] >= 1
    assert report["args"]["sizes"] == ["XS"] and report["args"]["repeats"] == 1
    assert "profiler" in report["memory_method"] and "profiler" in (out / "speed.md").read_text()


def test_speed_backward_counts_follow_the_strategies(speed):
    _, _, rows = speed
    assert rows[("full", 1)]["trained_steps"] == TRAINED
    assert rows[("full", 1)]["backward_passes"] == TRAINED and rows[("full", 1)]["backward_items"] == TRAINED
    for w in (2, 4, 8):
        windows = len(partition_windows(TRAINED, w))
        # one joint backward pass per window, carrying the 2 endpoint batches
        assert rows[("jagg", w)]["backward_passes"] == windows, w
        assert rows[("jagg", w)]["backward_items"] == 2 * windows, w
    assert rows[("subsample", 4)]["backward_passes"] == 2 * len(partition_windows(TRAINED, 4))


def test_speed_measures_against_full_of_the_same_cell(speed):
    _, _, rows = speed
    full = rows[("full", 1)]
    assert full["gradient_speedup"] == 1.0 and full["step_speedup"] == 1.0
    for r in rows.values():
        assert 0 < r["gradient_s"] < r["step_s"]
        assert r["step_s"] == pytest.approx(r["rollout_s"] + r["reward_s"] + r["gradient_s"], rel=1e-6)
        assert r["gradient_speedup"] == pytest.approx(full["gradient_s"] / r["gradient_s"])
        assert r["step_speedup"] == pytest.approx(full["step_s"] / r["step_s"])
        assert r["peak_memory_mib"] > 0
    # JAGG's joint pass holds the activations of both endpoint batches at once
    assert rows[("jagg", 2)]["peak_memory_mib"] > rows[("full", 1)]["peak_memory_mib"]


def test_peak_memory_counts_live_tensors_above_the_start():
    def allocate():
        a = torch.ones(2 << 20)  # 8 MiB
        b = torch.ones(1 << 20)  # 4 MiB
        del a
        c = torch.ones(3 << 20)  # 12 MiB: 16 MiB live at the peak
        del b, c

    assert peak_memory_mib(allocate, "cpu") == pytest.approx(16.0, abs=0.5)


def test_speed_refuses_a_non_empty_out_dir(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("keep me")
    assert main(["speed", *TINY, f"out={tmp_path}"]) == 2
    assert str(tmp_path) in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["old.txt"]


@pytest.mark.parametrize("arg, key", [("bogus=1", "bogus"), ("sizes=[XL]", "sizes"), ("resolutions=[18]", "resolutions"),
                                      ("scale=huge", "scale"), ("repeats=0", "repeats"), ("dtype=fp8", "dtype")])
def test_speed_names_the_bad_key(tmp_path, capsys, arg, key):
    assert main(["speed", f"out={tmp_path / 'new'}", arg]) == 2
    assert key in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_scale_paper_adds_sizes_resolutions_and_yields_to_the_command_line(tmp_path):
    cpu = parse_args([f"out={tmp_path}"])
    assert cpu.sizes == ["XS", "S"] and cpu.resolutions == [16, 32]
    paper = parse_args(["scale=paper", "repeats=2", f"out={tmp_path}"])
    assert paper.sizes == ["XS", "S", "B"] and paper.resolutions == [16, 32, 64]
    assert paper.repeats == 2 and paper.prompts * paper.group_size > cpu.prompts * cpu.group_size
    for resolution in paper.resolutions:  # the DiT's patch size fits every resolution of the table
        policy = DiTPolicy(size="XS", resolution=resolution)
        x = torch.zeros(1, *policy.sample_shape)
        assert policy(x, torch.ones(1), policy.encode_prompts(["a red circle"])).shape == x.shape
