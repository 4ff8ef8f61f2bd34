"""`python -m jagg_lab.bench COMMAND [key=value ...]`: one benchmark per command."""
from __future__ import annotations

import logging
import sys
from typing import Callable

from jagg_lab.bench import arms, bias, speed, step, strategies

# command -> its main(argv) -> exit status; a new benchmark is one more entry
COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "strategies": strategies.main,
    "speed": speed.main,
    "bias": bias.main,
    "arms": arms.main,
    "step": step.main,
}


def usage() -> str:
    return (f"usage: python -m jagg_lab.bench {{{'|'.join(COMMANDS)}}} [key=value ...]\n"
            "       python -m jagg_lab.bench COMMAND --help   (the command's keys)\n")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(f"jagg_lab.bench: {usage()}")
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
