"""GRPO training entry point.

    python -m jagg_lab.train +experiment=jagg_w4 trainer.max_steps=50 hydra.run.dir=DIR

Only Hydra is imported before the config is composed, so `--help` and `--cfg job` answer at
once; the run itself is `jagg_lab.training.run` (whose names this module also offers:
`from jagg_lab.train import build` still works).
"""
from __future__ import annotations

import multiprocessing
import sys

import hydra
from omegaconf import DictConfig

from jagg_lab import CONF_DIR


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def main(cfg: DictConfig) -> None:
    from jagg_lab.sweeps import idle_worker_ignores_signals, job_running, leave_when_orphaned

    if multiprocessing.parent_process() is not None:  # a sweep's worker: signals pass to the sweep from the start,
        idle_worker_ignores_signals()
        leave_when_orphaned()  # and it ends with the sweep once idle
    from jagg_lab.training import run

    with job_running():
        run(cfg)


def __getattr__(name: str):
    """The training module's names (build, read_checkpoint, ConfigError, ...), imported on first use."""
    from jagg_lab import training

    try:
        return getattr(training, name)
    except AttributeError:
        raise AttributeError(f"module 'jagg_lab.train' has no attribute {name!r}") from None


if __name__ == "__main__":
    from jagg_lab.renamed import renamed_overrides

    renamed = renamed_overrides(sys.argv[1:])
    if renamed:  # before Hydra, whose own error would only say the key is unknown
        sys.exit("jagg_lab.train: invalid configuration: " + "; ".join(renamed))
    main()
