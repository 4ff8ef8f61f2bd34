"""Checkpoints that are either complete or absent (written to a temporary file, then renamed),
and that load without running code.

A checkpoint is a pickle, and unpickling can call any function the file names. jagg_lab's own
checkpoints hold only tensors, numbers, strings and containers of them, so every checkpoint a
user names (`resume=`, `policy.checkpoint=`, `jagg_lab.evaluate run=`) is read with torch's
`weights_only=True` unpickler, which builds nothing else; a file that needs anything else is
refused with one line naming the key, the file and what it holds. A sharded checkpoint
(trainer=fsdp: a directory) is checked part by part the same way before anything reads it.
"""
from __future__ import annotations

import io
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from jagg_lab.rundir import ConfigError

__all__ = ["AtomicCheckpointIO", "UNSAFE", "load_checkpoint", "refuse_unsafe", "rng_state", "set_rng_state",
           "publish_dir", "recover_published", "remove_leftover_writes", "PICKLED_WEIGHTS", "refuse_pickled_weights",
           "METADATA", "read_sharded_checkpoint"]

UNSAFE = "holds Python objects that jagg_lab checkpoints never contain"


def refuse_unsafe(key: str, path: str | Path, what: list[str] | str) -> ConfigError:
    """The error for a file whose unpickling would build or call `what` (names of globals)."""
    names = ", ".join(what) if isinstance(what, list) else what
    return ConfigError(f"{key}: {path} {UNSAFE} ({names or 'objects torch will not load'}); it was not loaded")


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def load_checkpoint(path: str | Path, key: str) -> Any:
    """torch.load of a checkpoint file a user named (`key`: the setting that named it), with
    weights_only=True; a missing, unreadable or unsafe file is a ConfigError of one line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{key}: no such checkpoint {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        try:  # what the file holds that weights_only refused, from the pickle's opcodes (nothing is built)
            unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
        except Exception:  # not a zip checkpoint, or opcodes the scan does not know
            unsafe = []
        if unsafe or "Unsupported global" in str(err):
            raise refuse_unsafe(key, path, unsafe) from None
        raise ConfigError(f"{key}: {path} is not a readable checkpoint ({_first_line(err)})") from err
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise ConfigError(f"{key}: {path} is not a readable checkpoint ({_first_line(err)})") from err


def rng_state() -> dict:
    """Every global random state (torch, numpy, python, CUDA), for an exact resume.
    Tensors, ints and tuples only: Lightning loads checkpoints with weights_only=True."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class AtomicCheckpointIO(TorchCheckpointIO):
    """A crash or a full disk mid-write leaves the previous checkpoint intact, never a truncated one."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            os.replace(tmp, path)  # atomic on POSIX within one filesystem
        finally:
            tmp.unlink(missing_ok=True)


# ---- weights of other libraries (diffusers, transformers): safetensors only ---------------------------
PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickled_weights(directory: str | Path, key: str) -> None:
    """A model directory a user named (`key`) must hold its weights as safetensors: a pickled
    weight file (.bin, .pt, ...) in it or its component folders, where that folder has no
    .safetensors beside it, is refused naming the file, since unpickling it can run code."""
    directory = Path(directory)
    for folder in [directory, *(p for p in sorted(directory.iterdir()) if p.is_dir())]:
        pickled = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in PICKLED_WEIGHTS)
        if pickled and not any(folder.glob("*.safetensors")):
            raise ConfigError(
                f"{key}: {pickled[0]} is a pickled weight file, and unpickling can run code; jagg_lab loads "
                "safetensors only. Convert it where you trust its source (load it, then save_pretrained(..., "
                "safe_serialization=True)) and name the converted directory.")


# ---- a sharded checkpoint is a directory: written whole as `.NAME.tmp`, then swapped in -------------
def _swap_names(path: Path) -> tuple[Path, Path]:
    return path.with_name(f".{path.name}.tmp"), path.with_name(f".{path.name}.old")


def publish_dir(path: Path) -> None:
    """Put the complete checkpoint directory `.NAME.tmp` in place of `path` (NAME), keeping the
    previous one as `.NAME.old` until the new one is in place. A kill between the two renames
    leaves no `path`; `recover_published` then puts the new one there."""
    tmp, old = _swap_names(path)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def recover_published(path: Path) -> str | None:
    """Mend what a kill during `publish_dir` left, before `path` is read or written again, and say
    what was done (None: nothing to mend). No `path` but `.NAME.old`: the kill came between the two
    renames, which start only once every rank has written `.NAME.tmp`, so that one is complete and
    goes in place (the previous checkpoint if it is gone too); `path` and a stale `.NAME.old`: the
    kill came after both renames, and the old one is removed."""
    path = Path(path)
    tmp, old = _swap_names(path)
    if not old.exists():
        return None
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        return f"removed {old.name}, left by a save killed after it had put {path.name} in place"
    newest = tmp if tmp.exists() else old
    os.replace(newest, path)
    shutil.rmtree(old, ignore_errors=True)
    return (f"{path.name} was missing (a save killed between its renames): put the "
            f"{'new, complete checkpoint' if newest == tmp else 'previous checkpoint'} in its place")


_LEFTOVER = re.compile(r"^\..+\.tmp-(\d+)$")


def remove_leftover_writes(directory: Path) -> list[str]:
    """Delete the temporary files of checkpoint writes that were killed (`.NAME.tmp-PID` whose
    process no longer runs) in `directory`; returns their names. A write still in progress is kept."""
    removed = []
    for path in sorted(Path(directory).glob(".*.tmp-*")):
        match = _LEFTOVER.match(path.name)
        if match is None or not path.is_file() or _running(int(match.group(1))):
            continue
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- sharded checkpoints (trainer=fsdp: a directory of shards) ---------------------------
METADATA = "meta.pt"  # what Lightning writes beside the shards: counters, RNG states, ...


class _MetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint's `.metadata` is a plain pickle (protocol 4, which torch's
    weights_only unpickler does not read): unpickled with the globals its writer uses and no
    others, Python's documented way to restrict a pickle."""

    ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
               ("pathlib", "Path"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}

    def find_class(self, module: str, name: str):
        found = super().find_class(module, name) if module.startswith("torch") or module in ("collections", "pathlib") else None
        if ((module, name) in self.ALLOWED or module == "torch.distributed.checkpoint.metadata"
                or (module == "torch" and isinstance(found, torch.dtype))):
            return found
        raise pickle.UnpicklingError(f"{module}.{name}")


def _check_shards(path: Path, key: str):
    """The metadata of a sharded checkpoint, read without running code, after checking that every
    non-tensor entry in the shards (torch.save bytes, which torch.distributed.checkpoint later
    unpickles unrestricted) loads with weights_only=True."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    try:
        with open(path / ".metadata", "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as err:
        raise refuse_unsafe(key, path / ".metadata", str(err)) from None
    except Exception as err:
        raise ConfigError(f"{key}: {path / '.metadata'} is not a readable checkpoint ({type(err).__name__})") from err
    for fqn, entry in metadata.state_dict_metadata.items():
        if not isinstance(entry, BytesStorageMetadata):
            continue
        info = metadata.storage_data[MetadataIndex(fqn)]
        shard = path / info.relative_path
        if getattr(info, "transform_descriptors", None) or shard.parent != path:
            raise ConfigError(f"{key}: {path}: entry {fqn} is stored in a way jagg_lab checkpoints never are")
        with open(shard, "rb") as f:
            f.seek(info.offset)
            data = f.read(info.length)
        try:
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise refuse_unsafe(key, shard, f"entry {fqn}") from None
        except Exception as err:
            raise ConfigError(f"{key}: {shard} is not a readable checkpoint (entry {fqn}: {type(err).__name__})") from err
    return metadata


def read_sharded_checkpoint(path: str | Path, key: str = "resume") -> dict:
    """What a sharded checkpoint directory holds besides the shards (counters, RNG states),
    with a clear error for a directory that is not one; every part of it is checked to load
    without running code before anything reads it (`key`: the setting that named it)."""
    path = Path(path)
    if not (path / ".metadata").is_file() or not (path / METADATA).is_file():
        raise ConfigError(f"{key}: {path} is a directory but not a sharded checkpoint (no .metadata and {METADATA})")
    _check_shards(path, key)
    state = load_checkpoint(path / METADATA, key)
    if "rollouts_done" not in state:
        raise ConfigError(f"{key}: {path} is not a jagg_lab training checkpoint (missing rollouts_done)")
    return state
