"""jagg_lab's local sweep launcher: Hydra's joblib launcher whose sweep stops cleanly on Ctrl-C
or a closed terminal and says what each job left (see `jagg_lab.sweeps`). Hydra takes launchers
from its `hydra_plugins` namespace only, hence this package; `conf/hydra/launcher/local.yaml`
selects it."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Sequence

from hydra.core.utils import JobStatus
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from omegaconf import OmegaConf, open_dict

from jagg_lab.sweeps import plan_jobs, stop_on_signal, sweep_report

__all__ = ["LocalLauncher"]

log = logging.getLogger(__name__)


class LocalLauncher(JoblibLauncher):
    """Hydra's joblib launcher (same settings) whose sweep stops cleanly on Ctrl-C or SIGHUP and
    records its jobs (SWEEP_DIR/jobs.json) before any starts, their outcome (jobs.txt) after."""

    def job_dirs(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[str]:
        """Each job's directory under the sweep's, as Hydra's launcher will make it (hydra.sweep.subdir)."""
        if OmegaConf.to_container(self.config.hydra.sweep, resolve=False).get("subdir") == "${hydra.job.num}":
            return [str(initial_job_idx + i) for i in range(len(job_overrides))]  # the default, without loading each config
        dirs = []
        for i, overrides in enumerate(job_overrides):
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id, config.hydra.job.num = f"{config.hydra.job.name}_{initial_job_idx + i}", initial_job_idx + i
            dirs.append(str(config.hydra.sweep.subdir))
        return dirs

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        dirs = self.job_dirs(job_overrides, initial_job_idx)
        plan_jobs(sweep_dir, {initial_job_idx + i: (d, o) for i, (d, o) in enumerate(zip(dirs, job_overrides))})
        runs, broken = [], None
        with stop_on_signal(sweep_dir) as stopped:
            try:
                runs = super().launch(job_overrides, initial_job_idx)
            except Exception as err:  # a worker died (killed): joblib ends the whole pool
                broken = err
        errors = {initial_job_idx + i: run.return_value for i, run in enumerate(runs) if run.status == JobStatus.FAILED}
        sweep_report(sweep_dir, errors)
        if broken is not None:  # e.g. a signal reached a worker still starting, before it could take it
            log.error("the sweep ended early: %s: %s; the lines above (and %s) say how each job goes on",
                      type(broken).__name__, broken, sweep_dir / "jobs.txt")
            sys.exit(128 + stopped[0] if stopped else 1)
        if stopped:
            sys.exit(128 + stopped[0])  # the shell's convention: the sweep was ended by a signal
        return runs
