"""`python -m jagg_lab.train` with a fault at a chosen point, for the kill and interrupt tests:

    python -m tests.faults POINT N SIGNAL [train overrides ...]

POINT is where the process signals itself, on the N-th time it gets there: `rollout` (a
rollout starts), `gradient` (a micro-batch's backward passes start), `last_write` /
`periodic_write` (halfway through writing last.ckpt / a step_*.ckpt: the temporary file holds
half its bytes), `verdict` (the end-of-run held-out verdict starts). SIGNAL: KILL or INT.
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path

from lightning.pytorch.plugins.io import TorchCheckpointIO

from jagg_lab.callbacks.heldout import HeldoutEval
from jagg_lab.module import GRPOModule

TARGETS = {"rollout": (GRPOModule, "make_rollout"), "gradient": (GRPOModule, "micro_batch_backward"),
           "verdict": (HeldoutEval, "_verdict")}


def install(point: str, nth: int, signum: int) -> None:
    calls = [0]

    def fire() -> None:
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), signum)

    if point in TARGETS:
        owner, name = TARGETS[point]
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            fire()
            return original(*args, **kwargs)

        setattr(owner, name, wrapped)
        return
    prefix = {"last_write": ".last.ckpt.tmp", "periodic_write": ".step_"}[point]
    save = TorchCheckpointIO.save_checkpoint

    def half_written(self, checkpoint, path, storage_options=None):
        save(self, checkpoint, path, storage_options)
        if Path(path).name.startswith(prefix) and calls[0] + 1 == nth:
            data = Path(path).read_bytes()
            Path(path).write_bytes(data[: len(data) // 2])
            fire()
        elif Path(path).name.startswith(prefix):
            calls[0] += 1

    TorchCheckpointIO.save_checkpoint = half_written


if __name__ == "__main__":
    point, nth, name, *overrides = sys.argv[1:]
    install(point, int(nth), getattr(signal, f"SIG{name}"))
    sys.argv = [sys.argv[0], *overrides]
    runpy.run_module("jagg_lab.train", run_name="__main__", alter_sys=True)  # as `python -m jagg_lab.train`
