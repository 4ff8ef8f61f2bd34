"""`python -m jagg_lab.train` with a fault at a chosen point, for the kill and interrupt tests:

    python -m tests.faults POINT N SIGNAL [train overrides ...]

POINT is where the process signals itself, on the N-th time it gets there: `rollout` (a
rollout starts), `gradient` (a micro-batch's backward passes start), `last_write` /
`periodic_write` (halfway through writing last.ckpt / a step_*.ckpt: the temporary file holds
half its bytes), `verdict` (the end-of-run held-out verdict starts). SIGNAL: KILL or INT.

    python -m tests.faults POINT N ENOSPC [train overrides ...]

A full disk instead of a signal: the N-th write at POINT writes part of its bytes, then raises
OSError(ENOSPC): `last_write` (last.ckpt), `metrics` (an append of metrics.csv rows),
`verdict_write` (heldout_final.json).
"""
from __future__ import annotations

import errno
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


def _full(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def install_full_disk(point: str, nth: int) -> None:
    """The N-th write at `point` writes part of its bytes, then fails as a full disk does."""
    calls = [0]

    def due() -> bool:
        calls[0] += 1
        return calls[0] == nth

    if point == "last_write":
        save = TorchCheckpointIO.save_checkpoint

        def full_checkpoint(self, checkpoint, path, storage_options=None):
            if Path(path).name.startswith(".last.ckpt.tmp") and due():
                Path(path).write_bytes(b"partial")
                raise _full(path)
            save(self, checkpoint, path, storage_options)

        TorchCheckpointIO.save_checkpoint = full_checkpoint
    elif point == "metrics":
        from lightning.pytorch.loggers.csv_logs import ExperimentWriter

        append = ExperimentWriter.save

        def full_metrics(self):
            if self.metrics and Path(self.metrics_file_path).is_file() and due():
                with open(self.metrics_file_path, "a") as f:
                    f.write("7,0.25,")  # part of a row
                raise _full(self.metrics_file_path)
            append(self)

        ExperimentWriter.save = full_metrics
    elif point == "verdict_write":
        write_text = Path.write_text

        def full_json(self, data, *args, **kwargs):
            if self.name.startswith(".heldout_final.json.tmp") and due():
                write_text(self, data[: len(data) // 2], *args, **kwargs)
                raise _full(self)
            return write_text(self, data, *args, **kwargs)

        Path.write_text = full_json
    else:
        raise ValueError(f"no full-disk point {point!r}")


if __name__ == "__main__":
    point, nth, name, *overrides = sys.argv[1:]
    if name == "ENOSPC":
        install_full_disk(point, int(nth))
    else:
        install(point, int(nth), getattr(signal, f"SIG{name}"))
    sys.argv = [sys.argv[0], *overrides]
    runpy.run_module("jagg_lab.train", run_name="__main__", alter_sys=True)  # as `python -m jagg_lab.train`
