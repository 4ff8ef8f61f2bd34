"""Training progress as log lines, so the console and train.log show the same thing.

    step 13/100 [###-----------------] 13% | 0:01:20 elapsed, ETA 0:08:55 | 6.15 s/step | reward 0.453 | loss -1.2e-05

Step and total count optimizer steps of the whole run (a resumed run starts at its checkpoint's
step); elapsed time counts from this process's first step. The rate (s/step) and the ETA follow
the last RECENT_STEPS steps, so a pause (a suspended process, a held-out evaluation) fades out of
them instead of inflating the rest of the run's rate; a resume does not divide its time by steps
it did not take. The loss is printed with 3 significant
digits: GRPO's per-step loss is ~1e-5 and rounds to 0 at a fixed 3 decimals.
"""
from __future__ import annotations

import logging
import math
import time
import warnings
from collections import deque
from datetime import timedelta
from typing import Callable

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, Timer

__all__ = ["StepProgress", "SampleProgress", "progress_line", "count_line", "quiet_third_party"]

log = logging.getLogger(__name__)

BAR_WIDTH = 20

# Lightning messages that are known to be harmless here and would bury the progress lines.
_QUIET_WARNINGS = (
    # manual optimization: the module checkpoints after its optimizer steps on purpose
    r"Using ModelCheckpoint with manual optimization",
    # a torch/Lightning version pair, not something a user can act on
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)
_QUIET_MESSAGES = ("💡 Tip:",)  # adverts for other Lightning products


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).lstrip().startswith(_QUIET_MESSAGES)


def quiet_third_party() -> None:
    """Send Lightning's messages and Python warnings through the root logger (so train.log
    records what the console shows), minus the known-harmless warnings and adverts."""
    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    logging.captureWarnings(True)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):  # Lightning's own stderr handler
            logger.removeHandler(handler)
        logger.propagate = True
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _DropAdverts) for f in handler.filters):
            handler.addFilter(_DropAdverts())


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds))) if math.isfinite(seconds) else "-:--:--"


RECENT_STEPS = 10  # the rate and the ETA follow this many latest steps


def progress_line(step: int, total: int | None, elapsed_s: float, steps_done: int, reward: float, loss: float,
                  time_left_s: float | None = None, rate_s: float | None = None) -> str:
    """One progress line. total: None when the run is bounded by time only; time_left_s: what
    remains of a wall-clock budget (the ETA is the sooner of the two ends). rate_s: seconds per
    step (default: the mean over the steps_done steps of elapsed_s)."""
    rate = rate_s if rate_s is not None else elapsed_s / steps_done if steps_done else math.nan
    eta = rate * (total - step) if total is not None else math.inf
    if time_left_s is not None:
        eta = min(eta, time_left_s)
    if total is not None:
        filled = round(BAR_WIDTH * step / total)
        where = f"step {step}/{total} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * step // total}%"
    else:
        where = f"step {step}"
    return (f"{where} | {_clock(elapsed_s)} elapsed, ETA {_clock(eta)} | {rate:.2f} s/step | "
            f"reward {reward:.3f} | loss {loss:.3g}")


def count_line(label: str, done: int, total: int, elapsed_s: float) -> str:
    """One progress line of work counted in samples (an evaluation), as `progress_line` for steps:
    `held-out verdict: 128/512 samples [#####---------------] 25% | 0:00:31 elapsed, ETA 0:01:33`."""
    eta = elapsed_s / done * (total - done) if done else math.inf
    filled = round(BAR_WIDTH * done / total)
    return (f"{label}: {done}/{total} samples [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * done // total}% | "
            f"{_clock(elapsed_s)} elapsed, ETA {_clock(eta)}")


class SampleProgress:
    """`on_batch` of `jagg_lab.evaluation.sample_images`: a `count_line` after each batch, at most
    one per `interval_s` (the last always), when there is more than one batch; and a stop, by
    raising `stop_error`, once `should_stop()` says so."""

    def __init__(self, label: str, total: int, interval_s: float = 5.0, should_stop: Callable[[], bool] | None = None,
                 stop_error: type[Exception] = RuntimeError):
        self.label, self.total, self.interval_s = label, total, interval_s
        self.should_stop, self.stop_error = should_stop, stop_error
        self._t0 = self._last = time.monotonic()
        self._lines = 0

    def __call__(self, done: int) -> None:
        now, last = time.monotonic(), done >= self.total
        if (self._lines == 0 and not last) or (self._lines and (last or now - self._last >= self.interval_s)):
            self._last, self._lines = now, self._lines + 1
            log.info(count_line(self.label, done, self.total, now - self._t0))
        if not last and self.should_stop is not None and self.should_stop():
            raise self.stop_error(f"{self.label} stopped after {done}/{self.total} samples")


class StepProgress(ProgressBar):
    """Replaces Lightning's bar (whose epoch counter and rate mean nothing for an endless prompt
    stream). interval_s: at most one line per this many seconds (the first and last step always
    print); 0 = every step."""

    def __init__(self, interval_s: float = 5.0):
        super().__init__()
        if interval_s < 0:
            raise ValueError(f"progress.interval_s must be >= 0, got {interval_s}")
        self.interval_s = interval_s
        self._enabled = True
        self._start_step = 0
        self._t0 = self._last_print = 0.0
        self._ends: deque[float] = deque(maxlen=RECENT_STEPS + 1)  # when the latest steps ended (the first: the start)

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_step = trainer.global_step
        self._t0 = self._last_print = time.monotonic()
        self._ends.clear()
        self._ends.append(self._t0)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        now = time.monotonic()
        self._ends.append(now)
        step, total = trainer.global_step, trainer.max_steps if trainer.max_steps > 0 else None
        last = total is not None and step >= total
        if not (step == self._start_step + 1 or last or now - self._last_print >= self.interval_s):
            return
        self._last_print = now
        metrics = trainer.callback_metrics
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)  # set by trainer.max_time
        time_left = timer.time_remaining("train") if timer is not None else None
        recent = (self._ends[-1] - self._ends[0]) / (len(self._ends) - 1)
        log.info(progress_line(step, total, now - self._t0, step - self._start_step,
                               float(metrics.get("reward", math.nan)), float(metrics.get("loss", math.nan)), time_left,
                               rate_s=recent))
