"""Sharded data parallelism (FSDP2) for GRPO: `trainer=fsdp` (GPUs) and `trainer=fsdp_cpu` (tests).

Each process keeps 1/N of the policy's weights, gradients and optimizer state: the policy
names the modules to shard (`shard_modules()`, inner ones first) and `shard_model` applies
`torch.distributed.fsdp.fully_shard` to each. Rollouts run sharded: every forward
all-gathers a module and frees it again, and every rank makes the same rollout calls.

The gradient phase cannot work that way. A strategy makes as many backward passes as it
likes, and not always as many on every rank (`jagg_routed` routes by the data, an optimizer
step's rows split unevenly over ranks), while an all-gather needs every rank. So an
optimizer step communicates at two points only, the same on every rank:

1. `gather_for_passes`: one all-gather per sharded module; the modules stay whole and
   FSDP's own gradient reduction is off, so the passes run locally, however many there
   are, and accumulate whole gradients as plain autograd does;
2. `reduce_scatter_gradients`: ONE reduce-scatter (a sum, as DDP's all-reduce) of all the
   accumulated gradients leaves each rank its shard as the sharded parameters' `.grad`;
   the modules are sharded again and the optimizer steps on the shards.

The price of a communication-free gradient phase: during it each rank holds the whole
weights (in `param_dtype`) and the whole gradient, as under DDP; the optimizer state and
the master weights stay sharded throughout.

Checkpoints are directories of per-rank shards (torch.distributed.checkpoint) that resume
under FSDP; `python -m jagg_lab.sharding checkpoint=DIR` writes one file of full weights
that single-process tools read.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.optim.swa_utils import AveragedModel

from jagg_lab.checkpointing import METADATA, publish_dir, read_sharded_checkpoint, recover_published
from jagg_lab.strategies.core import flat_grad

__all__ = ["FSDPStrategy", "shard_model", "is_sharded", "gather_for_passes", "reduce_scatter_gradients", "sum_gradients",
           "export_weights", "memory_mib", "METADATA", "read_sharded_checkpoint", "consolidate_checkpoint"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(key: str, name: str | None) -> torch.dtype | None:
    if name is not None and name not in _DTYPES:
        raise ValueError(f"trainer.strategy.{key} must be one of {sorted(_DTYPES)} or null, got {name!r}")
    return _DTYPES.get(name)


class FSDPStrategy(ModelParallelStrategy):
    """Lightning's ModelParallelStrategy as plain FSDP2: one data-parallel dimension over all
    processes, no tensor parallelism. `GRPOModule.configure_model` shards through `shard`.

    param_dtype: the dtype weights are all-gathered in and forward and backward run in (null:
    the weights' own). reduce_dtype: the dtype gradients accumulate and are reduce-scattered
    in (null: param_dtype). cpu_offload: keep the shards (weights, gradients, optimizer state)
    in host memory; the optimizer steps on the CPU. save_distributed_checkpoint: checkpoints
    as directories of per-rank shards (true) or as one full file rank 0 assembles (false).
    process_group_backend: nccl, gloo, or null for the device's default.
    """

    def __init__(self, param_dtype: str | None = None, reduce_dtype: str | None = None, cpu_offload: bool = False,
                 save_distributed_checkpoint: bool = True, process_group_backend: str | None = None):
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint, process_group_backend=process_group_backend)
        self.mp_policy = MixedPrecisionPolicy(param_dtype=_dtype("param_dtype", param_dtype),
                                              reduce_dtype=_dtype("reduce_dtype", reduce_dtype))
        self.cpu_offload = cpu_offload

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes  # every process holds a shard
        super().setup_environment()

    def shard(self, *models: nn.Module | None, diagnostics: bool = False) -> None:
        """Shard each model given (None and non-modules are skipped; an EMA's average). `diagnostics`:
        the gradient strategy compares its gradients with `full`'s, which reads whole float32 ones."""
        if diagnostics and self.mp_policy.param_dtype is not None:
            raise ValueError("strategy.diagnose_every needs trainer.strategy.param_dtype=null under FSDP")
        for model in models:
            if isinstance(model, AveragedModel):
                model.multi_avg_fn = _sharded_apart(model.multi_avg_fn) if model.multi_avg_fn is not None else None
                model = model.module
            if isinstance(model, nn.Module):
                offload = CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda") if self.cpu_offload else OffloadPolicy()
                shard_model(model, self.device_mesh["data_parallel"], self.mp_policy, offload)

    def model_to_device(self) -> None:
        if not self.cpu_offload:
            return super().model_to_device()
        # Offloaded shards stay in host memory (FSDP copies them over for each use); all else moves.
        self.model._apply(lambda t: t if isinstance(t, DTensor) else t.to(self.root_device))

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        """Shards are written beside `filepath` and renamed into place once every rank is done,
        so a crash mid-write leaves the previous checkpoint whole (as AtomicCheckpointIO does
        for files)."""
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        tmp = path.with_name(f".{path.name}.tmp")
        if self.is_global_zero:
            recover_published(path)  # an earlier save killed between its renames: mend it before writing over .tmp
            shutil.rmtree(tmp, ignore_errors=True)
        self.barrier()
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier()
        if self.is_global_zero:
            publish_dir(path)
        self.barrier()


def _sharded_apart(multi_avg_fn):
    """An EMA update that averages sharded weights and unsharded buffers in separate calls:
    one foreach call must not mix DTensors and tensors."""

    def update(averaged: list, current: list, num_averaged: torch.Tensor) -> None:
        for sharded in (True, False):
            pairs = [(a, c) for a, c in zip(averaged, current) if isinstance(a, DTensor) == sharded]
            if pairs:
                multi_avg_fn([a for a, _ in pairs], [c for _, c in pairs], num_averaged)

    return update


# ---- sharding and the two communication points of an optimizer step -------------------------
def _units(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: nn.Module) -> bool:
    return bool(_units(model))


def shard_model(model: nn.Module, mesh, mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),
                offload_policy: OffloadPolicy = OffloadPolicy()) -> None:
    """Shard `model` module by module (`model.shard_modules()`), FSDP's own gradient reduction off."""
    units = list(model.shard_modules()) if hasattr(model, "shard_modules") else []
    if not units:
        raise TypeError(f"{type(model).__name__} does not name the modules FSDP shards (a shard_modules() method)")
    computes_in = getattr(model, "compute_dtype", torch.float32)  # a policy without one computes in float32
    if mp_policy.param_dtype not in (None, computes_in):
        raise ValueError(f"trainer.strategy.param_dtype={mp_policy.param_dtype} but {type(model).__name__} computes in "
                         f"{computes_in}: set trainer.strategy.param_dtype=null (or the policy's dtype)")
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=True, mp_policy=mp_policy, offload_policy=offload_policy)
    loose = [name for name, p in model.named_parameters() if p.requires_grad and not isinstance(p, DTensor)]
    if loose:
        raise ValueError(f"trainable parameters outside {type(model).__name__}.shard_modules(): {loose[:3]}")
    for unit in units:
        unit.set_requires_gradient_sync(False, recurse=False)
    # The first all-gather makes the buffers every later one reuses. Made under a rollout's
    # inference mode they could never take part in a backward pass, so make them here.
    for unit in units:
        unit.unshard()
    for unit in units:
        unit.reshard()


def gather_for_passes(model: nn.Module) -> None:
    """Communication point 1: all-gather every sharded module of `model` and keep it whole
    until `reduce_scatter_gradients`; the backward passes in between communicate nothing.
    Every rank calls this at the same point (a no-op for an unsharded model)."""
    for unit in _units(model):
        unit.set_reshard_after_forward(False, recurse=False)
        unit.set_reshard_after_backward(False, recurse=False)
        unit.unshard()


def _param_groups(unit: FSDPModule) -> list:
    state = unit._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)  # older torch: one group per module
    return list(groups) if groups is not None else [g for g in (state._fsdp_param_group,) if g is not None]


def _take_whole_grad(fsdp_param) -> torch.Tensor | None:
    """The gradient the passes accumulated for one parameter, whole; FSDP's copy is cleared.
    With a reduce_dtype unlike param_dtype FSDP accumulates in `unsharded_accumulated_grad`."""
    whole = getattr(fsdp_param, "_unsharded_param", None)
    parts = [g for g in (getattr(fsdp_param, "unsharded_accumulated_grad", None),
                         None if whole is None else whole.grad) if g is not None]
    fsdp_param.unsharded_accumulated_grad = None
    if whole is not None:
        whole.grad = None
    return sum(parts[1:], parts[0]) if parts else None


def reduce_scatter_gradients(model: nn.Module) -> None:
    """Communication point 2: ONE reduce-scatter, summing over ranks, of every gradient the
    passes accumulated since `gather_for_passes`; each rank's shard becomes `.grad` of its
    sharded parameter (a rank that made no pass sends zeros). Shards the modules again."""
    units = _units(model)
    for unit in units:  # frees the whole weights before the send buffer is made; gradients are separate tensors
        unit.reshard()
        unit.set_reshard_after_forward(True, recurse=False)
        unit.set_reshard_after_backward(True, recurse=False)
    entries = [(group, fp) for unit in units for group in _param_groups(unit) for fp in group.fsdp_params
               if fp.sharded_param.requires_grad]
    first = entries[0][1]
    mesh, world = first.sharded_param.device_mesh, first.sharded_param.device_mesh.size()
    dtype, device = first.reduce_dtype or first.param_dtype or first.orig_dtype, entries[0][0].device
    # Rank r's part of the send buffer holds its rows of every parameter: FSDP shards dim 0
    # the way torch.chunk does, padding each shard to the first one's size.
    slots = []
    for _, fp in entries:
        placement = fp.sharded_param.placements[0]
        if not (isinstance(placement, Shard) and placement.dim == 0):
            raise NotImplementedError(f"{fp._param_fqn}: only dim-0 sharding is reduce-scattered, got {placement}")
        slots.append(torch.chunk(torch.empty(fp.sharded_param.shape, device="meta"), world)[0].numel())
    send = torch.zeros(world, sum(slots), dtype=dtype, device=device)
    start = 0
    for (_, fp), slot in zip(entries, slots):
        grad = _take_whole_grad(fp)
        if grad is not None:
            for rank, rows in enumerate(torch.chunk(grad, world)):
                send[rank, start : start + rows.numel()] = rows.flatten()
        start += slot
    mine = torch.empty(sum(slots), dtype=dtype, device=device)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # its older name
    reduce_scatter(mine, send.flatten(), group=mesh.get_group())
    start = 0
    for (_, fp), slot in zip(entries, slots):
        param = fp.sharded_param
        grad = torch.zeros_like(param)  # laid out as the shard, where it lives (host memory when offloaded)
        local = grad.to_local()
        local.copy_(mine[start : start + local.numel()].view(local.shape))
        param.grad = grad
        start += slot


def sum_gradients(model: nn.Module, params: list[nn.Parameter]) -> None:
    """Sum the gradients the backward passes accumulated over all ranks: the reduce-scatter of
    a sharded model, else one all-reduce of `params`' gradients flattened together (DDP)."""
    if is_sharded(model):
        reduce_scatter_gradients(model)
    elif dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flat = flat_grad(params)
        dist.all_reduce(flat)
        for p, grad in zip(params, flat.split([p.numel() for p in params])):
            p.grad = grad.view_as(p)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def export_weights(model: nn.Module, path: Path) -> None:
    """`model.save(path, state)` with the whole weights, by rank 0; a sharded model's are
    gathered first, to which every rank must come."""
    state = None
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if _rank() == 0:
        model.save(path, state)


def memory_mib(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> str:
    """What this rank holds of the model between optimizer steps (its shard under FSDP): the
    trainable weights and the optimizer state; and the process's peak resident memory (and
    peak GPU memory allocated by torch, on a GPU), in MiB."""
    import resource

    def size(t: torch.Tensor) -> int:
        return (t.to_local() if isinstance(t, DTensor) else t).nbytes

    weights = sum(size(p) for p in params)
    state = sum(size(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    gpu = f", peak GPU allocated {torch.cuda.max_memory_allocated() / 2**20:.0f}" if torch.cuda.is_initialized() else ""
    return f"trainable weights {weights / 2**20:.3f}, optimizer state {state / 2**20:.3f}, peak resident {peak:.0f}{gpu}"


def resident_mib() -> float:
    """This process's resident memory now (not its peak), in MiB."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


# ---- sharded checkpoints outside training ------------------------------------------------
def consolidate_checkpoint(checkpoint: str | Path, out: str | Path) -> None:
    """A sharded checkpoint as one file in one process: its full `state_dict` and metadata,
    in the layout of a single-process checkpoint (`DiTPolicy(checkpoint=OUT)`,
    `jagg_lab.evaluate run=OUT`). The optimizer states are left out."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    checkpoint = Path(checkpoint)
    meta = read_sharded_checkpoint(checkpoint, key="checkpoint")  # first: checks every part loads without running code
    state: dict = {}
    _load_state_dict(state, storage_reader=FileSystemReader(checkpoint),
                     planner=_EmptyStateDictLoadPlanner(keys={"state_dict"}), no_dist=True)
    state.update(meta)
    tmp = Path(out).with_name(f".{Path(out).name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, out)


@dataclass
class ConsolidateArgs:
    """Write a sharded checkpoint (a directory made under trainer=fsdp) as one file of full weights."""

    checkpoint: str = "???"  # the checkpoint directory, e.g. RUN/checkpoints/last.ckpt
    out: str | None = None  # default: beside it, NAME.full.ckpt


def main(argv: list[str] | None = None) -> int:
    from jagg_lab import cli

    from jagg_lab.rundir import ConfigError

    def run(args: ConsolidateArgs) -> int:
        out = args.out or str(Path(args.checkpoint).with_suffix(".full.ckpt"))
        try:
            consolidate_checkpoint(args.checkpoint, out)
        except ConfigError as err:  # not a sharded checkpoint, or one that would run code
            sys.stderr.write(f"jagg_lab.sharding: {err}\n")
            return 2
        log.info("wrote %s", out)
        return 0

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return cli.run(run, ConsolidateArgs, "python -m jagg_lab.sharding", argv)


if __name__ == "__main__":
    raise SystemExit(main())
