"""`python -m jagg_lab.bench COMMAND key=value ...`: help, and bad values refused before any model is built."""
import subprocess
import sys
from pathlib import Path

import pytest

from jagg_lab.bench import common, strategies
from jagg_lab.bench.__main__ import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def test_help_lists_the_commands_and_exits_0(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


@pytest.mark.parametrize("command, key", [("strategies", "knot_budgets"), ("speed", "subsample_windows")])
def test_command_help_lists_its_keys_and_exits_0(capsys, command, key):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"python -m jagg_lab.bench {command}" in out and key in out


def test_help_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "jagg_lab.bench", "strategies", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: python -m jagg_lab.bench strategies") and "windows" in proc.stdout


@pytest.mark.parametrize("argv", [[], ["nope"], ["out=x.json"]])
def test_a_missing_or_unknown_command_prints_the_usage_and_exits_2(capsys, argv):
    assert main(argv) == 2
    assert "usage: python -m jagg_lab.bench {strategies|speed" in capsys.readouterr().err


@pytest.fixture
def no_model(monkeypatch):
    """Building a policy fails the test: a bad value must be refused before that."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(common, "dit_policy", refuse)
    monkeypatch.setattr(strategies, "_policy", refuse)


@pytest.mark.parametrize("arg, key", [
    ("bogus=1", "bogus"), ("windows=[0]", "windows"), ("modes=[fast]", "modes"), ("knot_spacings=[0]", "knot_spacings"),
    ("knot_budgets=[1]", "knot_budgets"), ("size=XL", "size"), ("resolution=18", "resolution"), ("policy=sd4", "policy"),
    ("dtype=fp8", "dtype"), ("num_steps=1", "num_steps"), ("repeats=0", "repeats"), ("device=tpu", "device"),
    ("checkpoint=/no/such/file.safetensors", "checkpoint"), ("out=/no/such/dir/bench.json", "out"), ("prompts=two", "prompts"),
])
def test_strategies_names_the_bad_key_before_building_a_model(no_model, capsys, arg, key):
    assert main(["strategies", arg]) == 2
    err = capsys.readouterr().err
    assert err.startswith("strategies: ") and key in err


def test_speed_names_the_bad_key_before_building_a_model(no_model, tmp_path, capsys):
    assert main(["speed", f"out={tmp_path / 'new'}", "windows=[0]"]) == 2
    assert "windows" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
