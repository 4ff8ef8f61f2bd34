"""Interrupt-safe training and the one writer of `checkpoints/last.ckpt`.

SIGINT / SIGTERM / SIGHUP (a closed terminal, a dropped ssh session) finish the optimizer step
in progress, write `last.ckpt` and stop the run normally (so the policy is exported too). After the last optimizer step (the end-of-run
held-out evaluation and verdict, the export) a signal cuts the held-out work short instead:
`last.ckpt` is already written then, and the policy is still exported.

`last.ckpt` is always the latest step: written every `every_n_steps` steps (with the periodic
`step_*.ckpt` Lightning's ModelCheckpoint writes), every `every_minutes` of wall time, on a
signal and at the end of training, by this callback alone, over the same name (a second
writer would make Lightning version the name: `last-v1.ckpt`).

A job of a sweep run in a worker process (`--multirun hydra/launcher=local`: Hydra's joblib
launcher) stops in the same way once the sweep's process has ended (`kill PID`, SIGKILL): the
signal reaches only that process, and its workers would otherwise go on training with nobody to
collect them. Each job then has its `last.ckpt` to resume from.

A second SIGINT quits at once, without saving. Across processes, the stop is decided at the
end of each step by all ranks together (any rank that received a signal stops them all), and
rank 0's clock decides the timed checkpoints, so every rank takes part in the same saves.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from jagg_lab.sweeps import parent_ended

__all__ = ["SafeStop", "parent_ended"]

log = logging.getLogger(__name__)

# SIGHUP, where the platform has it, as SIGTERM: a laptop run most often dies by its terminal closing
_SIGNALS = (signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))


class SafeStop(Callback):
    """dirpath: the checkpoint directory (last.ckpt is written there). every_minutes: refresh
    last.ckpt at this wall-time interval (0 = off). every_n_steps: also every N optimizer
    steps (0 = off); the last step is always written. stop_with_parent: in a process started by
    multiprocessing (a sweep's worker), stop as on SIGTERM once the parent process has ended."""

    POLL_S = 1.0  # how often a worker looks for its parent

    def __init__(self, dirpath: str | Path, every_minutes: float = 10.0, every_n_steps: int = 0,
                 stop_with_parent: bool = True):
        if every_minutes < 0:
            raise ValueError(f"checkpoint_every_minutes must be >= 0, got {every_minutes}")
        if every_n_steps < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {every_n_steps}")
        self.path = Path(dirpath) / "last.ckpt"
        self.every_s = every_minutes * 60
        self.every_n_steps = every_n_steps
        self.signal: int | None = None  # the signal that stopped the run, if any
        self.training_done = False  # the last optimizer step is behind: a signal now cuts the end-of-run work short
        self.after_training = False  # the signal came once training was done
        self._previous: dict[int, object] = {}
        self._last_save = 0.0
        self._saved_step: int | None = None
        self.stop_with_parent = stop_with_parent
        self.orphaned = False  # the parent process ended: nobody will collect this process's result
        self._watcher: tuple[threading.Thread, threading.Event] | None = None  # made in on_train_start (unpicklable)

    def _handle(self, signum: int, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: quit now
        self.signal = signum
        self.after_training = self.after_training or self.training_done  # a second signal does not undo it
        if self.training_done:
            log.warning("%s received: skipping the rest of the end-of-run evaluation; the policy is still exported "
                        "(Ctrl-C again to quit at once)", signal.Signals(signum).name)
        else:
            log.warning("%s received: finishing the current step, then writing %s (Ctrl-C again to quit without saving)",
                        signal.Signals(signum).name, self.path)

    @property
    def stopping(self) -> bool:
        """A signal arrived: work that can be cut short should stop."""
        return self.signal is not None

    def save(self, trainer: L.Trainer) -> None:
        """Write last.ckpt of the current step (every rank takes part)."""
        trainer.save_checkpoint(self.path, weights_only=False)  # the whole state (optimizer, loops, callbacks)
        self._last_save, self._saved_step = time.monotonic(), trainer.global_step
        log.info("step %d: wrote %s", trainer.global_step, self.path)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save = time.monotonic()
        # an ignored SIGHUP stays ignored: `nohup python -m jagg_lab.train ...` must outlive its terminal
        self._previous = {sig: signal.signal(sig, self._handle) for sig in _SIGNALS
                          if not (sig == getattr(signal, "SIGHUP", None) and signal.getsignal(sig) is signal.SIG_IGN)}
        if self.stop_with_parent and multiprocessing.parent_process() is not None and self._watcher is None:
            done = threading.Event()
            thread = threading.Thread(target=self._watch_parent, args=(done,), name="SafeStop-parent", daemon=True)
            self._watcher = (thread, done)
            thread.start()

    def _watch_parent(self, done: threading.Event) -> None:
        """Signal this process with SIGTERM once the process that started it has ended (until
        `done`); the handler runs in the main thread, as for a signal from outside."""
        while not done.wait(self.POLL_S):
            if parent_ended():
                self.orphaned = True
                log.warning("the process that started this one (%d) has ended: stopping this job as on SIGTERM",
                            multiprocessing.parent_process().pid)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def _stop_watching(self) -> None:
        """End the watcher before the handlers go: a SIGTERM it sends then would meet the default one."""
        if self._watcher is not None:
            thread, done = self._watcher
            done.set()
            thread.join()
            self._watcher = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        stop = trainer.strategy.reduce_boolean_decision(self.signal is not None, all=False)
        due = bool(self.every_s) and time.monotonic() - self._last_save >= self.every_s
        due = trainer.strategy.broadcast(due, src=0)
        step = trainer.global_step
        periodic = bool(self.every_n_steps) and step % self.every_n_steps == 0
        last = 0 < trainer.max_steps <= step
        if stop or due or periodic or last:
            self.save(trainer)
        if stop:
            self.signal = self.signal or signal.SIGINT  # a rank that got no signal stops with the others
            self.after_training = self.after_training or last  # it came during the last step: training is done all the same
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Before the end-of-run evaluation (the callbacks after this one): last.ckpt of the last
        step, if the run ended otherwise than at max_steps (max_time, an early stop)."""
        if self._saved_step != trainer.global_step:
            self.save(trainer)
        self.training_done = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop_watching()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A failed fit skips teardown: the worker process may run the sweep's next job."""
        self.teardown(trainer, pl_module, "fit")
