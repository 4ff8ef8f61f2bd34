"""A GRPO training run: the config checked, the run directory, the module, trainer and callbacks
built, training, the summary. `python -m jagg_lab.train` (`jagg_lab/train.py`, which imports this
only once Hydra has a config, so that `--help` answers at once) calls `run`.

Everything that can be checked is checked before any model is built or any file is
written into the run directory; a run never reuses a directory that holds a run.

Multi-process runs (trainer=ddp_cpu / ddp) start as one process that validates the config
and owns the run directory; the processes Lightning then starts (or a cluster launcher
starts next to it) re-enter here, build the same model and write nothing of their own.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from jagg_lab.callbacks import HeldoutEval, RunSummary, SafeStop, SampleGrids, quiet_third_party
from jagg_lab.callbacks.interrupt import parent_ended
from jagg_lab.checkpointing import (AtomicCheckpointIO, load_checkpoint, read_sharded_checkpoint, recover_published,
                                    remove_leftover_writes)
from jagg_lab.checks import check_missing, check_optimizer, check_run_settings, check_types
from jagg_lab.module import GRPOModule
from jagg_lab.objectives import Objective, TrajectoryGRPO
from jagg_lab.renamed import check_renamed
from jagg_lab.rundir import ConfigError, check_fresh_run_dir, disk_full, disk_full_message, remove_run_outputs, run_logger
from jagg_lab.sweeps import idle_worker_ignores_signals, in_local_sweep, mark_sweep_stopping, sweep_stopping

log = logging.getLogger(__name__)


def read_checkpoint(path: str) -> dict:
    """Load a training checkpoint for resume (without running code: `load_checkpoint`), with a
    clear error if it is missing, damaged or holds more than a checkpoint does."""
    state = load_checkpoint(path, "resume")
    missing = [key for key in ("state_dict", "optimizer_states", "rollouts_done") if key not in state]
    if missing:
        raise ConfigError(f"resume: {path} is not a jagg_lab training checkpoint (missing {', '.join(missing)})")
    return state


def is_launch_process() -> bool:
    """True in the process that owns the run directory: global rank 0 of the run, as told by
    Lightning's launcher or a cluster (RANK, LOCAL_RANK, SLURM_PROCID and NODE_RANK)."""
    return rank_zero_only.rank == 0 and int(os.environ.get("NODE_RANK", "0")) == 0


def check_world_size(cfg: DictConfig, samples_per_step: int) -> None:
    """The global batch must split evenly over the processes (when their number is known)."""
    devices, nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    if not (isinstance(devices, int) and isinstance(nodes, int)):
        return  # "auto" / lists: checked by the module once the trainer knows
    if devices < 1 or nodes < 1:
        raise ConfigError(f"trainer.devices ({devices}) and trainer.num_nodes ({nodes}) must be >= 1")
    if samples_per_step % (devices * nodes):
        raise ConfigError(
            f"data.prompts_per_step * data.group_size = {samples_per_step} samples do not split over "
            f"trainer.devices * trainer.num_nodes = {devices * nodes} processes"
        )


def _instantiate(cfg: DictConfig, key: str, **kwargs):
    check_types(cfg[key], key)
    try:
        return instantiate(cfg[key], **kwargs)
    except InstantiationException as err:
        cause = err.__cause__ or err
        raise ConfigError(f"{key}: {cause}") from err


def mend_checkpoint_dir(checkpoint: Path) -> None:
    """Before a resume reads `checkpoint`: put back a sharded checkpoint whose save was killed
    between its renames, and delete the temporary files of killed writes beside it."""
    mended = recover_published(checkpoint)
    if mended:
        log.warning("resume: %s", mended)
    removed = remove_leftover_writes(checkpoint.parent) if checkpoint.parent.is_dir() else []
    if removed:
        log.warning("resume: deleted %d temporary file(s) of killed checkpoint writes in %s: %s", len(removed),
                    checkpoint.parent, ", ".join(removed))


def build(cfg: DictConfig, run_dir: Path) -> tuple[GRPOModule, L.LightningDataModule, L.Trainer]:
    """Validate and build the run. Cheap parts first, so bad values fail before the policy loads."""
    owner = is_launch_process()
    if owner:
        check_fresh_run_dir(run_dir)
    check_renamed(cfg, ConfigError)  # an experiment file written before a key was renamed
    check_missing(cfg)
    if owner and cfg.resume is not None:
        mend_checkpoint_dir(Path(cfg.resume))
    resume_state = (None if cfg.resume is None else read_sharded_checkpoint(cfg.resume) if Path(cfg.resume).is_dir()
                    else read_checkpoint(cfg.resume))  # a directory: sharded (trainer=fsdp)
    check_run_settings(cfg, resume_state)
    check_types(cfg.trainer, "trainer")  # built last, once the run directory is made
    sampler = _instantiate(cfg, "sampler")
    grpo = _instantiate(cfg, "grpo")
    strategy = _instantiate(cfg, "strategy")
    objective = _instantiate(cfg, "objective") if cfg.get("objective") else TrajectoryGRPO()
    if not isinstance(objective, Objective):
        raise ConfigError(f"objective: {type(objective).__name__} is not a jagg_lab.objectives.Objective")
    problems = objective.check(cfg, grpo, sampler, strategy)  # e.g. drawn blocks need a strategy that keeps to them
    if problems:
        raise ConfigError("; ".join(problems))
    if not objective.trajectory:
        log.info("objective=%s samples by ODE: sampler.noise_level and sampler.log_prob_reduction are not used",
                 objective.name)
    data = _instantiate(cfg, "data")
    try:
        grpo.check_batch(data.samples_per_step)
        if grpo.sde_window is None:
            sampler.ode_phases(grpo.trained_steps(sampler.num_steps))
        else:
            grpo.sde_window_bounds(sampler.num_steps)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    check_world_size(cfg, data.samples_per_step)
    if resume_state is not None:
        data.start_index = resume_state["rollouts_done"]
    optimizer = _instantiate(cfg, "optimizer")
    check_optimizer(cfg, optimizer)
    heldout = _instantiate(cfg, "heldout", run_dir=str(run_dir))
    if heldout.enabled and not str(cfg.policy.get("_target_", "")).endswith("DiTPolicy"):
        log.info("held-out evaluation off: it scores the shapes world, which %s does not draw", cfg.policy._target_)
        heldout.n_samples = 0
    progress = _instantiate(cfg, "progress")
    loggers = [_instantiate(cfg, "logger", save_dir=str(run_dir))] if cfg.get("logger") else []
    reward = _instantiate(cfg, "reward")
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    policy = _instantiate(cfg, "policy")
    try:
        sampler.noise_levels(policy)  # the grid (sampler.schedule, sampler.shift) fits the policy
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if data.file_prompts is not None and hasattr(policy, "validate_prompts"):
        try:
            policy.validate_prompts(data.file_prompts)
        except ValueError as err:
            raise ConfigError(f"data.prompt_file: {err}") from err

    run_dir.mkdir(parents=True, exist_ok=True)
    if owner:
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    module = GRPOModule(
        policy=policy, sampler=sampler, reward=reward, strategy=strategy, grpo=grpo, optimizer=optimizer,
        group_size=data.group_size, seed=cfg.seed, sample_every=cfg.sample_every, run_dir=str(run_dir),
        max_bad_steps=cfg.max_bad_steps, objective=objective, log_memory=cfg.log_memory,
    )
    # The periodic step_*.ckpt; SafeStop alone writes last.ckpt (the latest step, whoever asks).
    checkpoints = ModelCheckpoint(
        dirpath=run_dir / "checkpoints", filename="step_{step:06d}", auto_insert_metric_name=False,
        every_n_train_steps=cfg.checkpoint_every, save_last=False, save_top_k=-1,
    )
    # In this order: the summary's clock counts the base's held-out evaluation, the progress rate does not;
    # last.ckpt is written before the end-of-run held-out evaluation starts.
    stop = SafeStop(checkpoints.dirpath, cfg.checkpoint_every_minutes, cfg.checkpoint_every)
    callbacks = [RunSummary(run_dir), stop, heldout, progress, SampleGrids(run_dir), checkpoints]
    logger = run_logger(run_dir, flush_logs_every_n_steps=1)
    trainer = instantiate(cfg.trainer, logger=[logger, *loggers], callbacks=callbacks, default_root_dir=str(run_dir),
                          plugins=[AtomicCheckpointIO()])
    return module, data, trainer


def leave_orphaned_worker(code: int) -> None:
    """End a sweep's worker process whose sweep has ended (nobody will collect its result; it
    would otherwise idle until its pool's timeout), after what a normal exit runs: flushed output
    and the exit hooks (a wandb run's finish among them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    atexit._run_exitfuncs()
    os._exit(code)


def run(cfg: DictConfig) -> None:
    """A training run of the composed config `cfg` in Hydra's run directory (`python -m jagg_lab.train`)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    owner = is_launch_process()
    quiet_third_party()
    earlier = set(os.listdir(run_dir)) if run_dir.is_dir() else set()  # never removed: maybe another run's
    if parent_ended():  # a worker of a killed sweep, handed the next job: start nothing
        log.warning("the sweep that started this process has ended: not starting %s", run_dir)
        if owner:
            remove_run_outputs(run_dir, keep=earlier)
        leave_orphaned_worker(128 + signal.SIGTERM)
    if multiprocessing.parent_process() is not None:
        idle_worker_ignores_signals()  # a sweep's worker: until training takes them, the sweep's process has the signals
    if sweep_stopping(run_dir):  # a sweep told to stop (Ctrl-C): its further jobs start nothing
        log.warning("the sweep is stopping: not starting %s", run_dir)
        if owner:
            remove_run_outputs(run_dir, keep=earlier)
        return
    try:
        module, data, trainer = build(cfg, run_dir)
    except BaseException as err:
        if owner:
            remove_run_outputs(run_dir, keep=earlier)  # Hydra made the directory before the config was checked
        if not isinstance(err, (ConfigError, FileNotFoundError)):
            raise
        sys.exit(f"jagg_lab.train: invalid configuration: {err}")
    if sweep_stopping(run_dir):  # the sweep was told to stop while this job was being built
        log.warning("the sweep is stopping: not training %s", run_dir)
        if owner:
            remove_run_outputs(run_dir, keep=earlier)
        return
    if owner:
        handler = logging.FileHandler(run_dir / "train.log")
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        logging.getLogger().addHandler(handler)
        quiet_third_party()  # and the new handler
        for logger in trainer.loggers:
            if not isinstance(logger, CSVLogger):  # config.yaml is the CSV run's record
                logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    log.info("run directory: %s", run_dir)
    summary, stop, heldout = (next(c for c in trainer.callbacks if isinstance(c, kind)) for kind in (RunSummary, SafeStop, HeldoutEval))
    try:
        trainer.fit(module, datamodule=data, ckpt_path=cfg.resume, weights_only=True)
    except BaseException as err:
        if owner and not summary.rewards:
            remove_run_outputs(run_dir, keep=earlier)  # failed before its first step: nothing worth keeping
        if disk_full(err):  # checkpoints, metrics rows and the verdict are whole or absent: say what to resume
            verdict = heldout.args(module.policy, final=True) if stop.training_done and heldout.final_base else None
            sys.exit(disk_full_message(run_dir, err, list(HydraConfig.get().overrides.task), verdict))
        raise
    interrupted = signal.Signals(stop.signal).name if stop.signal is not None else None
    if owner:
        summary.report(trainer, heldout, list(HydraConfig.get().overrides.task), interrupted, trained=stop.after_training)
    if stop.orphaned:  # a sweep's worker whose sweep was killed: end the process, not just the job
        leave_orphaned_worker(128 + (stop.signal or signal.SIGTERM))
    if interrupted and in_local_sweep():  # the sweep collects every job: mark it stopping and return,
        mark_sweep_stopping(run_dir, stop.signal)  # an exit would end it, killing jobs still stopping
        return
    if interrupted:
        sys.exit(128 + stop.signal)  # the shell's convention for a process ended by a signal

