"""experiments/gpu_bench.sh passes only keys the benchmarks accept (checked here without a GPU:
a stand-in `python` records each command, which is then parsed with device=cpu)."""
import os
import shlex
import subprocess
from pathlib import Path

from jagg_lab import cli
from jagg_lab.bench import speed, strategies

REPO = Path(__file__).resolve().parents[2]


def test_every_command_of_the_gpu_script_parses(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "commands.txt"
    (fake / "python").write_text(f'#!/usr/bin/env bash\nprintf "%q " "$@" >> {log}\necho >> {log}\n')
    (fake / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(REPO / "experiments/gpu_bench.sh"), str(tmp_path / "out")], env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in log.read_text().splitlines()]
    assert len(commands) == 4
    for argv in commands:
        assert argv[:2] == ["-m", "jagg_lab.bench"]
        name, args = argv[2], [a.replace("device=cuda", "device=cpu") for a in argv[3:]]
        for i, arg in enumerate(args):  # outputs into this test's directory
            if arg.startswith("out="):
                args[i] = f"out={tmp_path / 'parsed' / Path(arg[4:]).name}"
        (tmp_path / "parsed").mkdir(exist_ok=True)
        parsed = speed.parse_args(args) if name == "speed" else cli.parse(strategies.StrategiesArgs, args, prog=name)
        assert parsed.policy == "sd3_random"
