"""Sharded training (FSDP2 through Lightning's ModelParallelStrategy, CPU, gloo): a 2-process run
must take the 1-process step, reduce gradients once per optimizer step however many backward
passes it makes, resume exactly, and leave weights that a single process evaluates.

The 2-process runs start as `python -m tests.test_fsdp OUT` (this file's `__main__`): Lightning
launches the second process by running the same command again, as the training CLI does.
"""
from __future__ import annotations

import csv
import functools
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from jagg_lab.data import PromptDataModule
from jagg_lab.grpo import GRPOConfig
from jagg_lab.module import GRPOModule
from jagg_lab.policies import DiTPolicy
from jagg_lab.rewards import JpegCompressibility
from jagg_lab.sampling import SDESampler
from jagg_lab.sharding import FSDPStrategy, gather_for_passes, reduce_scatter_gradients, shard_model
from jagg_lab.sharding import main as consolidate_main
from jagg_lab.strategies import FullStrategy, JaggStrategy
from tests.conftest import randomized_policy
from tests.test_train_cli import REPO, TINY

STRATEGIES = {"full": FullStrategy, "jagg": functools.partial(JaggStrategy, window=4, mode="cached")}
# One rollout, two optimizer steps on it. With seed 1 an optimizer step's rows split 3 / 1 over
# the two ranks, so the ranks make different numbers of backward passes.
OPTIMIZER_STEPS, SEED = 2, 1
COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_gather",
               "all_gather_into_tensor", "all_gather_single", "broadcast")
FSDP = ["trainer=fsdp_cpu", "trainer.devices=2", "heldout.n_samples=0", "reward=jpeg",
        "optimizer.lr=1e-3", "checkpoint_every=1", *TINY]


class RecordingModule(GRPOModule):
    """Records, at each optimizer step, the whole weights the backward passes ran with, the
    summed gradient, the passes made, and every torch.distributed collective (optimizer step,
    phase, name, elements): phase `passes` is the strategy's backward passes, `sync` the
    gradient reduction."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.phase, self.calls, self.passes = "rollout", [], []
        self.weights: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []

    def count_collectives(self) -> None:
        for name in COLLECTIVES:
            if hasattr(dist, name):
                setattr(dist, name, self._counted(getattr(dist, name), name))

    def _counted(self, collective, name: str):
        def call(*args, **kwargs):
            given = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else [a])]
            numel = sum(t.numel() for t in given if isinstance(t, torch.Tensor))  # sent and received
            self.calls.append((len(self.grads), self.phase, name, numel))
            return collective(*args, **kwargs)

        return call

    def micro_batch_backward(self, rollout, advantages, idx, scale, on_policy):
        self.phase = "passes"
        stats = super().micro_batch_backward(rollout, advantages, idx, scale, on_policy)
        self.passes[-1] += stats["backward_passes"]
        return stats

    def accumulate_gradients(self, *args, **kwargs):
        self.passes.append(0)
        return super().accumulate_gradients(*args, **kwargs)

    def sync_gradients(self) -> None:
        # Here the weights are whole under FSDP too: gathered for the passes.
        self.weights.append(torch.cat([p.detach().flatten() for p in self.trainable_parameters()]).clone())
        self.phase = "sync"
        super().sync_gradients()
        self.phase = "after"
        self.grads.append(torch.cat([(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).flatten()
                                     for p in self.trainable_parameters()]))


def run(strategy: str, devices: int) -> RecordingModule:
    module = RecordingModule(
        policy=randomized_policy(seed=0),
        sampler=SDESampler(num_steps=4, shift=3.0, guidance=2.0),
        reward=JpegCompressibility(),
        strategy=STRATEGIES[strategy](),
        grpo=GRPOConfig(beta=0.04, train_fraction=1.0, micro_batch_size=1, max_grad_norm=0.02, ema_decay=0.9,
                        optimizer_steps_per_rollout=OPTIMIZER_STEPS),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1),  # the update is the clipped gradient itself
        group_size=4,
        seed=SEED,
        sample_every=0,
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy=FSDPStrategy(process_group_backend="gloo") if devices > 1 else "auto",
        max_steps=OPTIMIZER_STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,
    )
    if devices > 1:
        module.count_collectives()
    trainer.fit(module, datamodule=PromptDataModule(prompts_per_step=2, group_size=4, seed=5))
    return module


class BFloat16Blocks(nn.Module):
    """Residual MLP blocks that compute in bfloat16, as a diffusers policy with dtype=bfloat16."""

    compute_dtype = torch.bfloat16

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(3))
        self.head = nn.Linear(16, 4)

    def shard_modules(self) -> list[nn.Module]:
        return [*self.blocks, self]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for block in self.blocks:
                x = x + block(x)
            return self.head(x).float()


def bfloat16_gradient(rank: int, world: int) -> torch.Tensor:
    """The summed gradient of 6 backward passes, 4 on rank 0 and 2 on rank 1 when sharded with
    bfloat16 weights and float32 gradient accumulation (FSDP's mixed precision)."""
    model = BFloat16Blocks()
    batches = torch.randn(6, 8, 16, generator=torch.Generator().manual_seed(1))
    mine = range(6) if world == 1 else (range(4) if rank == 0 else range(4, 6))
    if world > 1:
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        shard_model(model, init_device_mesh("cpu", (world,)), mixed)
        gather_for_passes(model)
    for i in mine:
        model(batches[i]).square().mean().backward()
    if world > 1:
        reduce_scatter_gradients(model)
    return torch.cat([(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).flatten() for p in model.parameters()])


def main(out: Path) -> None:
    """Each process of a 2-process FSDP run records, for each strategy, what RecordingModule saw,
    and the gradient of the bfloat16 blocks."""
    for strategy in STRATEGIES:
        module = run(strategy, devices=2)
        record = {"weights": module.weights, "grads": module.grads, "calls": module.calls, "passes": module.passes}
        torch.save(record, out / f"{strategy}_r{module.shard[0]}.pt")
    rank = dist.get_rank()
    torch.save(bfloat16_gradient(rank, dist.get_world_size()), out / f"bfloat16_r{rank}.pt")


@pytest.fixture(scope="module")
def fsdp_records(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_records")
    proc = subprocess.run([sys.executable, "-m", "tests.test_fsdp", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_two_sharded_processes_take_the_single_process_first_step(fsdp_records: Path, strategy: str) -> None:
    single = run(strategy, devices=1)
    update = single.weights[1] - single.weights[0]
    assert update.abs().max() > 0  # the comparison below means something
    for rank in (0, 1):
        record = torch.load(fsdp_records / f"{strategy}_r{rank}.pt")
        torch.testing.assert_close(record["grads"][0], single.grads[0], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(record["weights"][1] - record["weights"][0], update, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_one_gradient_reduction_per_optimizer_step_however_many_passes(fsdp_records: Path, strategy: str) -> None:
    records = [torch.load(fsdp_records / f"{strategy}_r{rank}.pt") for rank in (0, 1)]
    assert records[0]["passes"] != records[1]["passes"]  # ranks made different numbers of backward passes
    for record in records:
        assert len(record["grads"]) == OPTIMIZER_STEPS and max(record["passes"]) > 1
        calls = record["calls"]
        assert [c for c in calls if c[1] == "passes"] == []  # the passes communicate nothing
        for step in range(OPTIMIZER_STEPS):
            sync = [(name, numel) for s, phase, name, numel in calls if s == step and phase == "sync"]
            assert len(sync) == 1 and sync[0][0].startswith("reduce_scatter") and sync[0][1] >= record["grads"][step].numel()
        # Nothing else reduced gradients: FSDP's own reduce-scatters are off; what remains are
        # Lightning's one-element stop decisions.
        others = [c for c in calls if c[1] != "sync" and c[2].startswith(("reduce", "all_reduce"))]
        assert all(numel == 1 for *_, numel in others), others


def test_mixed_precision_accumulates_every_pass_in_float32(fsdp_records: Path) -> None:
    reference = bfloat16_gradient(rank=0, world=1)  # float32 weights, the same bfloat16 compute
    for rank in (0, 1):
        sharded = torch.load(fsdp_records / f"bfloat16_r{rank}.pt")
        assert ((sharded - reference).norm() / reference.norm()).item() < 0.02  # bfloat16 weights' rounding


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    proc = subprocess.run([sys.executable, "-m", "jagg_lab.train", "+experiment=jagg_w4", *FSDP, "trainer.max_steps=2",
                           f"hydra.run.dir={run_dir}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Starting with 2 processes" in proc.stderr + proc.stdout
    return run_dir


def read_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_fsdp_run_through_the_cli_writes_metrics_sharded_checkpoints_and_a_policy(fsdp_run: Path, tmp_path: Path) -> None:
    from jagg_lab.evaluate import main as evaluate

    assert [int(r["step"]) for r in read_rows(fsdp_run / "metrics.csv")] == [1, 2]  # only rank 0 logs
    last = fsdp_run / "checkpoints" / "last.ckpt"
    assert last.is_dir() and len(list(last.glob("*.distcp"))) == 2  # one shard per process
    assert (fsdp_run / "policy.safetensors").is_file()
    out = tmp_path / "eval.json"
    assert evaluate(["source=policy", f"run={fsdp_run}", "n_samples=4", "num_steps=2", "batch_size=4", f"out={out}"]) == 0
    assert out.is_file()


def test_a_sharded_checkpoint_loads_in_one_process(fsdp_run: Path, tmp_path: Path) -> None:
    from jagg_lab.evaluate import main as evaluate

    full = fsdp_run / "checkpoints" / "step_000002.full.ckpt"
    assert consolidate_main([f"checkpoint={fsdp_run / 'checkpoints' / 'step_000002.ckpt'}"]) == 0 and full.is_file()
    assert evaluate(["source=policy", f"run={full}", "n_samples=4", "num_steps=2", "batch_size=4",
                     f"out={tmp_path / 'eval.json'}"]) == 0
    policy = DiTPolicy(size="XS", checkpoint=str(full))
    exported = load_file(fsdp_run / "policy.safetensors")  # the same weights, gathered when training ended
    assert exported.keys() == policy.state_dict().keys()
    for name, weight in policy.state_dict().items():
        assert torch.equal(weight, exported[name]), name


def test_resume_under_fsdp_equals_the_uninterrupted_run(fsdp_run: Path, tmp_path: Path) -> None:
    resumed = tmp_path / "resumed"
    proc = subprocess.run([sys.executable, "-m", "jagg_lab.train", "+experiment=jagg_w4", *FSDP, "trainer.max_steps=2",
                           f"resume={fsdp_run / 'checkpoints' / 'step_000001.ckpt'}", f"hydra.run.dir={resumed}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    straight, rows = read_rows(fsdp_run / "metrics.csv"), read_rows(resumed / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [2]
    assert float(rows[0]["grad_norm"]) > 0
    keys = [k for k in straight[1] if not k.startswith("time_")]
    assert {k: rows[0][k] for k in keys} == {k: straight[1][k] for k in keys}
    a, b = load_file(fsdp_run / "policy.safetensors"), load_file(resumed / "policy.safetensors")
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["full", "jagg_w4", "jagg_routed", "jagg_cv_w4", "jagg_knots3", "subsample_w4"])
def test_every_gradient_strategy_trains_under_fsdp(experiment: str, tmp_path: Path) -> None:
    """Two optimizer steps per rollout: the second is off-policy and its rows split unevenly."""
    run = tmp_path / experiment
    proc = subprocess.run([sys.executable, "-m", "jagg_lab.train", f"+experiment={experiment}", *FSDP, "trainer.max_steps=2",
                           "grpo.optimizer_steps_per_rollout=2", "grpo.train_fraction=1.0", "sampler.num_steps=8",
                           f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(run / "metrics.csv")
    assert len(rows) == 2 and all(float(r["grad_norm"]) > 0 for r in rows)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
