"""jagg_lab's local sweep launcher: Hydra's joblib launcher whose sweep stops cleanly on Ctrl-C
or a closed terminal and says what each job left (see `jagg_lab.sweeps`). Hydra takes launchers
from its `hydra_plugins` namespace only, hence this package; `conf/hydra/launcher/local.yaml`
selects it."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobStatus
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

from jagg_lab.sweeps import report_jobs, stop_on_signal

__all__ = ["LocalLauncher"]


class LocalLauncher(JoblibLauncher):
    """Hydra's joblib launcher (same settings) whose sweep stops cleanly on Ctrl-C or SIGHUP."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with stop_on_signal(sweep_dir) as stopped:
            runs = super().launch(job_overrides, initial_job_idx)
        report_jobs(sweep_dir, [Path(run.hydra_cfg.hydra.runtime.output_dir) for run in runs],
                    [run.return_value if run.status == JobStatus.FAILED else None for run in runs])
        if stopped:
            sys.exit(128 + stopped[0])  # the shell's convention: the sweep was ended by a signal
        return runs
