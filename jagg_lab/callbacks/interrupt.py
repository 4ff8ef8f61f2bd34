"""Interrupt-safe training: SIGINT / SIGTERM finish the optimizer step in progress, write
`checkpoints/last.ckpt` and stop the run normally (so the policy is exported too); `last.ckpt`
is also refreshed every `every_minutes` of wall time, whatever the step count.

A second SIGINT quits at once, without saving. Across processes, the stop is decided at the
end of each step by all ranks together (any rank that received a signal stops them all), and
rank 0's clock decides the timed checkpoints, so every rank takes part in the same saves.
"""
from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

__all__ = ["SafeStop"]

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SafeStop(Callback):
    """dirpath: the checkpoint directory (last.ckpt is written there). every_minutes: refresh
    last.ckpt at this wall-time interval (0 = only on signals and the step-based checkpoints)."""

    def __init__(self, dirpath: str | Path, every_minutes: float = 10.0):
        if every_minutes < 0:
            raise ValueError(f"checkpoint_every_minutes must be >= 0, got {every_minutes}")
        self.path = Path(dirpath) / "last.ckpt"
        self.every_s = every_minutes * 60
        self.signal: int | None = None  # the signal that stopped the run, if any
        self._previous: dict[int, object] = {}
        self._last_save = 0.0

    def _handle(self, signum: int, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: quit now
        self.signal = signum
        log.warning("%s received: finishing the current step, then writing %s (Ctrl-C again to quit without saving)",
                    signal.Signals(signum).name, self.path)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        self._previous = {sig: signal.signal(sig, self._handle) for sig in _SIGNALS}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        stop = trainer.strategy.reduce_boolean_decision(self.signal is not None, all=False)
        due = bool(self.every_s) and time.monotonic() - self._last_save >= self.every_s
        due = trainer.strategy.broadcast(due, src=0)
        if stop or due:
            trainer.save_checkpoint(self.path)
            self._last_save = time.monotonic()
            log.info("step %d: wrote %s", trainer.global_step, self.path)
        if stop:
            self.signal = self.signal or signal.SIGINT  # a rank that got no signal stops with the others
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
