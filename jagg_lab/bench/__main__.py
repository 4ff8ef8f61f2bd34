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


# command -> what it measures, one line of --help
SUMMARIES: dict[str, str] = {
    "strategies": "the gradient phase of many strategies on one rollout: time, speedup over full, memory, "
                  "cosine to full's gradient",
    "speed": "whole GRPO steps per model size x resolution x strategy (the speed table): seconds and ratios to full",
    "bias": "a strategy's gradient estimate against full's over many rollouts: its bias and the variance it adds",
    "arms": "each training experiment's gradient phase on the training stream's batches, timed side by side",
    "step": "where a whole step's time goes (rollout, reward, gradient phase) per experiment, rollout setting "
            "and precision",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: python -m jagg_lab.bench {{{'|'.join(COMMANDS)}}} [key=value ...]",
             "       python -m jagg_lab.bench COMMAND --help   (the command's keys)", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {SUMMARIES[name]}" for name in COMMANDS]
    return "\n".join(lines) + "\n"


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
