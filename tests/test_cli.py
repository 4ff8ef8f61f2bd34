"""The key=value command line of the non-Hydra entry points (jagg_lab.cli), and every
entry point that uses it answering --help and refusing unknown keys."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from jagg_lab import cli
from tests.test_train_cli import REPO


@dataclass
class Args:
    """Counts things (the docstring --help shows)."""

    n: int = 3  # how many
    name: str = "???"
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    out: str | None = None

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")


def test_parse_reads_typed_values_into_the_dataclass():
    args = cli.parse(Args, ["name=x", "n=5", "seeds=[2,3]", "out=null"], prog="count")
    assert args == Args(n=5, name="x", seeds=[2, 3], out=None)


@pytest.mark.parametrize("argv, key", [
    (["name=x", "bogus=1"], "bogus"),  # a key the dataclass lacks
    (["name=x", "n=abc"], "n"),  # a value of the wrong type
    (["n=1"], "name"),  # a required value left out
    (["name=x", "n=-1"], "n must be >= 0"),  # the dataclass's own check
    (["name=x", "seeds=[a]"], "seeds"),
    (["name=x", "out=[a=x/*_seed[012]]"], "out: cannot read the value"),  # a list item YAML cannot read, unquoted
])
def test_parse_errors_name_the_key(argv, key):
    with pytest.raises(cli.UsageError, match=key):
        cli.parse(Args, argv, prog="count")


@dataclass
class Globs:
    finals: list[str] = field(default_factory=list)


def test_a_quoted_list_item_holding_brackets_is_read_as_written():
    """The quoting the error suggests reads the item as written."""
    args = cli.parse(Globs, ["finals=['a=x/*_seed[012]/eval.json',b=y]"], prog="choice")
    assert args.finals == ["a=x/*_seed[012]/eval.json", "b=y"]
    with pytest.raises(cli.UsageError, match=r"finals: cannot read .*quote"):
        cli.parse(Globs, ["finals=[a=x/*_seed[012]/eval.json,b=y]"], prog="choice")


def test_help_shows_the_docstring_and_every_field_with_default_and_comment():
    with pytest.raises(cli.HelpRequested) as shown:
        cli.parse(Args, ["n=oops", "--help"], prog="python count.py")  # help wins over errors
    text = shown.value.text
    assert text.startswith("usage: python count.py [key=value ...]\n") and "Counts things" in text
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "n: int = 3 how many" in lines
    assert "name: str = (required)" in lines and "seeds: list[int] = [0, 1]" in lines
    assert cli.help_text(Args, "p", description="Other words.").count("Other words.") == 1


def test_run_exits_0_on_help_2_on_a_bad_line_and_otherwise_returns_main(capsys):
    calls = []
    main = lambda args: calls.append(args) or 7  # noqa: E731
    assert cli.run(main, Args, "python count.py", ["-h"]) == 0
    assert "how many" in capsys.readouterr().out
    assert cli.run(main, Args, "python count.py", ["name=x", "bogus=1"]) == 2
    assert capsys.readouterr().err.startswith("count.py: unknown key 'bogus'")
    assert not calls  # nothing ran for either
    assert cli.run(main, Args, "python count.py", ["name=x"]) == 7 and calls == [Args(name="x")]
    assert cli.run(lambda args: None, Args, "python count.py", ["name=x"]) == 0


ENTRY_POINTS = [["-m", "jagg_lab.evaluate"], ["experiments/quality.py"], ["experiments/collate.py"],
                ["experiments/paired.py"], ["experiments/default_gain.py"]]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda e: e[-1])
def test_entry_points_answer_help_and_refuse_unknown_keys(entry):
    run = lambda *argv: subprocess.run([sys.executable, *entry, *argv], cwd=REPO,  # noqa: E731
                                       capture_output=True, text=True, timeout=300)
    shown = run("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: ") and "out:" in shown.stdout, shown.stderr[-2000:]
    refused = run("bogus_key=1")
    assert refused.returncode == 2 and "bogus_key" in refused.stderr


def test_bench_help_says_what_each_command_measures(capsys):
    from jagg_lab.bench.__main__ import COMMANDS, main

    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    for name in COMMANDS:  # one line each: the name, then what it measures
        (line,) = [line for line in shown.splitlines() if line.split()[:1] == [name]]
        assert len(line.split()) > 4


def test_train_help_describes_the_run_its_commands_and_where_keys_are_documented(tmp_path):
    shown = subprocess.run([sys.executable, "-m", "jagg_lab.train", "--help"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: python -m jagg_lab.train"), shown.stderr[-2000:]
    for text in ("GRPO fine-tuning", "common commands:", "+experiment=jagg_w4", "resume=", "--multirun",
                 "docs/training.md", "conf/train.yaml", "strategy: full, jagg"):
        assert text in shown.stdout
    # the README's command 1 comes first among the commands
    commands = shown.stdout.split("common commands:", 1)[1]
    assert commands.strip().startswith("python -m jagg_lab.train +experiment=awm heldout.final_n_samples=2048")
    for doc in ("docs/training.md", "docs/strategies.md", "conf/train.yaml"):  # what it points to exists
        assert (REPO / doc).is_file()
    assert not any(tmp_path.iterdir())
