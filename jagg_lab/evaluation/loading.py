"""Policies to evaluate, from the directory of a `python -m jagg_lab.train` run.

A run directory holds the resolved `config.yaml` (its `policy` node is one `_target_` whose keys
are the constructor's arguments) and, once training ended, `policy.safetensors` (plus
`checkpoints/*.ckpt` along the way). Building the policy from that node and loading the
trained weights into it works for any policy class, not only the shapes DiT.
"""
from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch import nn

from jagg_lab.checkpointing import load_checkpoint
from jagg_lab.rundir import unfinished_run
from jagg_lab.sampling import SDESampler

__all__ = ["EXPORTED_WEIGHTS", "find_run", "load_policy_weights", "load_run_policy", "run_policies"]

EXPORTED_WEIGHTS = "policy.safetensors"  # where GRPOModule.on_train_end exports the trained policy


def find_run(path: str | Path) -> tuple[Path, Path]:
    """(run directory, weights file) for a run directory (its exported policy) or for a weights
    file inside one (`policy_ema.safetensors`, `checkpoints/step_000050.ckpt`): the run is the
    nearest directory at or above `path` that holds config.yaml."""
    path = Path(path)
    run_dir = next((d for d in (path, *path.parents) if (d / "config.yaml").is_file()), None)
    if run_dir is None:
        raise FileNotFoundError(f"{path}: not in a jagg_lab.train run directory (no config.yaml at or above it)")
    weights = run_dir / EXPORTED_WEIGHTS if path == run_dir else path
    if not weights.is_file():
        state = unfinished_run(run_dir) if path == run_dir else None
        raise FileNotFoundError(f"{weights}: the run has no exported policy" + (f"; it {state}" if state else " (did it finish?)")
                                + ("; its checkpoints/last.ckpt can be evaluated: run=" + str(run_dir / "checkpoints" / "last.ckpt")
                                   if (run_dir / "checkpoints" / "last.ckpt").is_file() else ""))
    return run_dir, weights


def load_policy_weights(policy: nn.Module, weights: str | Path) -> nn.Module:
    """Trained weights into a built policy, in place.

    A policy with its own `load` (DiTPolicy: checks its config against the file's) does it;
    any other gets the state dict of a safetensors file, or the `policy.` entries of a
    training checkpoint (.ckpt), loaded strictly.
    """
    weights = Path(weights)
    if hasattr(policy, "load"):
        policy.load(weights)
        return policy
    if weights.suffix == ".ckpt":
        module_state = load_checkpoint(weights, "run")["state_dict"]
        state = {k.removeprefix("policy."): v for k, v in module_state.items() if k.startswith("policy.")}
    else:
        state = load_file(str(weights))
    try:
        policy.load_state_dict(state)
    except RuntimeError as err:  # missing, unexpected or mis-shaped entries
        raise ValueError(f"{weights} does not match the run's policy: {err}") from err
    return policy


def load_run_policy(path: str | Path) -> nn.Module:
    """The trained policy of a run (or the weights file `path` names inside one), in eval mode:
    the run's policy config instantiated with hydra, then its weights loaded."""
    run_dir, weights = find_run(path)
    policy = instantiate(OmegaConf.load(run_dir / "config.yaml").policy)
    return load_policy_weights(policy, weights).eval()


def run_policies(run_dir: str | Path, checkpoint: str = EXPORTED_WEIGHTS) -> tuple[nn.Module, nn.Module, SDESampler]:
    """The trained policy of a `jagg_lab.train` run, the base it started from, and its sampler.

    The base is the run's policy config as written: its checkpoint, or, with
    `policy.checkpoint: null`, the random weights that training drew after seeding with the
    run's seed (train.build seeds right before it builds the policy).
    """
    run_dir = Path(run_dir)
    cfg = OmegaConf.load(run_dir / "config.yaml")
    trained = load_run_policy(run_dir / checkpoint)  # checks the weights exist before building the base
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        base = instantiate(cfg.policy)
    return trained, base.eval(), instantiate(cfg.sampler)
