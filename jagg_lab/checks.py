"""Checks of the training config that no constructor of ours makes: missing values, each
value's type against its constructor's annotation, the top-level and trainer keys, and the
optimizer (torch's, built once on a dummy parameter). Each raises ConfigError naming the key,
before any model is built or file written."""
from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any, Callable

import torch
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from jagg_lab.rundir import ConfigError

__all__ = ["check_missing", "check_types", "check_run_settings", "check_optimizer", "TRAINER_PRECISIONS"]

# Lightning precisions that keep float32 weights: *-true half precisions would cast the weights,
# the optimizer state and the SDE math with them. 16-mixed is for GPUs (Lightning runs bf16 on CPU).
TRAINER_PRECISIONS = ("32-true", "32", "bf16-mixed", "16-mixed")

# Words of torch.optim's errors -> the config key they are about.
_OPTIMIZER_WORDS = {"learning rate": "lr", "epsilon": "eps", "beta": "betas", "weight_decay": "weight_decay",
                    "momentum": "momentum", "dampening": "dampening"}


def check_missing(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing value for {', '.join(missing)} (set {missing[0]}=...)")


def _constructor_hints(target: str) -> dict[str, Any]:
    """{argument: annotation} of what `_target_` names ({} where they cannot be read: Hydra then
    reports the target itself)."""
    try:
        built = get_object(target)
        return typing.get_type_hints(built.__init__ if isinstance(built, type) else built)
    except Exception:  # an unknown target, or annotations that do not resolve at run time
        return {}


_SCALARS = (bool, int, float, str)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _fits(value: Any, hint: Any) -> bool:
    """False only where `value` plainly is not of the annotated type: the scalars (int, float,
    bool, str, None), Literal, unions and sequences or mappings of them. Any other annotation
    (a class, a callable) is the constructor's to check."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        # A YAML scalar is judged by the union's scalar members: `lr: float | Tensor` refuses 'abc'.
        scalars = [arg for arg in args if arg in _SCALARS or typing.get_origin(arg) is typing.Literal]
        if scalars and isinstance(value, _SCALARS):
            args = scalars
        return any(_fits(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint in (list, tuple) or origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, (ListConfig, list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(args) == len(value) and all(_fits(v, a) for v, a in zip(value, args))
        return not args or all(_fits(v, args[0]) for v in value)
    if hint is dict or origin in (dict, collections.abc.Mapping):
        return isinstance(value, (DictConfig, dict))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return True


def check_types(node: DictConfig, key: str) -> None:
    """Every value of the config group `key` (and of the configs nested in it) against the type
    its `_target_`'s constructor annotates: `sampler.num_steps=abc` is refused as
    "sampler.num_steps must be int, got 'abc'", not by whatever the constructor does with it."""
    if not isinstance(node, DictConfig):
        return
    hints = _constructor_hints(str(node["_target_"])) if "_target_" in node else {}
    for name in node:
        name = str(name)
        if name.startswith("_") or OmegaConf.is_missing(node, name):  # _target_, ...; "???" is check_missing's
            continue
        value = node[name]
        if isinstance(value, DictConfig) and "_target_" in value:
            check_types(value, f"{key}.{name}")
        elif name in hints and not _fits(value, hints[name]):
            raise ConfigError(f"{key}.{name} must be {_type_name(hints[name])}, got {value!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_run_settings(cfg: DictConfig, resume_state: dict | None) -> None:
    """seed, sample_every, checkpoint_every, checkpoint_every_minutes, max_bad_steps and the
    trainer's bounds: a run must have something to do, and an end."""
    rules = {
        "seed": _is_int(cfg.seed) and cfg.seed >= 0,
        "sample_every": _is_int(cfg.sample_every) and cfg.sample_every >= 0,
        "checkpoint_every": _is_int(cfg.checkpoint_every) and cfg.checkpoint_every >= 1,
        "checkpoint_every_minutes": isinstance(cfg.checkpoint_every_minutes, (int, float)) and cfg.checkpoint_every_minutes >= 0,
        "max_bad_steps": _is_int(cfg.max_bad_steps) and cfg.max_bad_steps >= 1,
    }
    for key, ok in rules.items():
        if not ok:
            raise ConfigError(f"{key} = {cfg[key]!r} is invalid (seed, sample_every, checkpoint_every_minutes >= 0; "
                              "checkpoint_every, max_bad_steps >= 1)")
    trainer = cfg.trainer
    max_steps, max_time = trainer.get("max_steps", -1), trainer.get("max_time")
    if not _is_int(max_steps) or max_steps == 0 or max_steps < -1:
        raise ConfigError(f"trainer.max_steps must be >= 1 (or -1 with trainer.max_time), got {max_steps!r}")
    if max_steps == -1 and max_time is None:
        raise ConfigError("trainer.max_steps=-1 needs trainer.max_time (DD:HH:MM:SS): the run would never end")
    max_epochs = trainer.get("max_epochs", -1)
    if max_epochs is not None and (not _is_int(max_epochs) or max_epochs == 0 or max_epochs < -1):
        raise ConfigError(f"trainer.max_epochs must be -1 (the prompt stream is endless) or >= 1, got {max_epochs!r}")
    sanity = trainer.get("num_sanity_val_steps", 0)
    if not _is_int(sanity) or sanity < -1:
        raise ConfigError(f"trainer.num_sanity_val_steps must be >= -1, got {sanity!r}")
    precision = str(trainer.get("precision", "32-true"))
    if precision not in TRAINER_PRECISIONS:
        raise ConfigError(f"trainer.precision must be one of {', '.join(TRAINER_PRECISIONS)}, got {precision!r}: the "
                          "SDE math, log-probs and optimizer state stay float32 (bf16-mixed autocasts the transformer)")
    every = trainer.get("log_every_n_steps", 1)
    if not _is_int(every) or every < 1:
        raise ConfigError(f"trainer.log_every_n_steps must be >= 1, got {every!r}")
    if resume_state is not None and max_steps != -1 and resume_state.get("global_step", 0) >= max_steps:
        raise ConfigError(f"trainer.max_steps = {max_steps} leaves nothing to do: the checkpoint {cfg.resume} is "
                          f"at step {resume_state['global_step']}")


def check_optimizer(cfg: DictConfig, optimizer: Callable) -> None:
    """Build the (partial) optimizer on one dummy parameter, so torch's checks run now."""
    try:
        optimizer([torch.nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as err:
        text = str(err).lower()
        keys = [key for word, key in _OPTIMIZER_WORDS.items() if word in text and key in cfg.optimizer]
        named = f"optimizer.{keys[0]}" if keys else "optimizer"
        raise ConfigError(f"{named}: {err}") from err
