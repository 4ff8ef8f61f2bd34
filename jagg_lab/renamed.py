"""Config keys that were renamed: an old key is refused with the name that replaced it, never
dropped or read silently. Light on imports: `python -m jagg_lab.train` checks its command line
with it before Hydra composes anything."""
from __future__ import annotations

from typing import Iterable

from omegaconf import DictConfig, OmegaConf

__all__ = ["RENAMED_KEYS", "renamed_overrides", "check_renamed"]

# old key -> new key. The moving SDE window of Flow-GRPO-Fast / MixGRPO is `grpo.sde_window*`;
# `strategy.window` is JAGG's window W.
RENAMED_KEYS = {
    "grpo.window_size": "grpo.sde_window",
    "grpo.window_schedule": "grpo.sde_window_schedule",
    "grpo.window_range": "grpo.sde_window_range",
    "grpo.window_shift_every": "grpo.sde_window_shift_every",
    "grpo.window_stride": "grpo.sde_window_stride",
}


def _message(old: str) -> str:
    return f"{old} was renamed {RENAMED_KEYS[old]} (the moving SDE window; strategy.window is JAGG's): set {RENAMED_KEYS[old]}"


def renamed_overrides(overrides: Iterable[str]) -> list[str]:
    """Why each `key=value` override (with +, ++ or ~ prefixes) names a renamed key, one line each."""
    keys = (o.split("=", 1)[0].lstrip("+~") for o in overrides if not o.startswith("-"))
    return [_message(key) for key in keys if key in RENAMED_KEYS]


def check_renamed(cfg: DictConfig, error: type[Exception] = ValueError) -> None:
    """Refuse a composed config that sets a renamed key (an experiment file written before the rename)."""
    found = [_message(old) for old in RENAMED_KEYS if OmegaConf.select(cfg, old, default=None) is not None]
    if found:
        raise error("; ".join(found))
