"""Lightning callbacks of a training run, one job each, wired by `jagg_lab.train`.

    progress  step/total, elapsed, ETA, reward and loss as log lines (console and train.log)
    interrupt SIGINT / SIGTERM stop the run safely; the one writer of checkpoints/last.ckpt
    heldout   paired held-out evaluations against the base, checkpoints/best.ckpt, early stop
    grids     captioned sample grids: one row per prompt group, rewards under the samples
    summary   the end-of-run summary (console, train.log, summary.json)
"""
from jagg_lab.callbacks.grids import SampleGrids, captioned_grid
from jagg_lab.callbacks.heldout import HeldoutEval
from jagg_lab.callbacks.interrupt import SafeStop
from jagg_lab.callbacks.progress import SampleProgress, StepProgress, count_line, progress_line, quiet_third_party
from jagg_lab.callbacks.summary import RunSummary

__all__ = ["SampleGrids", "captioned_grid", "HeldoutEval", "SafeStop", "SampleProgress", "StepProgress", "count_line", "progress_line",
           "quiet_third_party", "RunSummary"]
