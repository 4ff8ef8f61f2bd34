"""Multi-process training (Lightning DDP on CPU, gloo): a 2-process run must train on the same
global batch as a 1-process run, with whole groups, distinct noise and one gradient sync."""
from __future__ import annotations

import csv
import functools
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from jagg_lab.data import PromptDataModule
from jagg_lab.grpo import GRPOConfig
from jagg_lab.module import GRPOModule
from jagg_lab.rewards import JpegCompressibility
from jagg_lab.sampling import SDESampler, shard_noise
from jagg_lab.strategies import JaggStrategy
from tests.conftest import randomized_policy
from tests.test_train_cli import REPO, TINY

PROMPTS_PER_STEP, GROUP_SIZE = 2, 4


class RecordingModule(GRPOModule):
    """Writes what each rank saw at the first optimizer step: its initial noise, the global
    advantages, the gradient after the sync, and how many syncs ran."""

    def __init__(self, record_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.record_dir = Path(record_dir)
        self.syncs = 0

    def _save(self, name: str, value) -> None:
        rank, world = self.shard
        torch.save(value, self.record_dir / f"{name}_w{world}_r{rank}.pt")

    def make_rollout(self, prompts, generator):
        rollout = super().make_rollout(prompts, generator)
        self._save("noise", rollout.states[:, 0].clone())
        return rollout

    def advantages(self, rewards, group_ids):
        advantages = super().advantages(rewards, group_ids)
        self._save("advantages", advantages.clone())
        return advantages

    def sync_gradients(self) -> None:
        super().sync_gradients()
        self.syncs += 1
        self._save("grad", torch.cat([p.grad.flatten() for p in self.trainable_parameters()]))
        self._save("syncs", self.syncs)


def run_first_step(record_dir: Path, devices: int) -> None:
    module = RecordingModule(
        record_dir=str(record_dir),
        policy=randomized_policy(seed=0),
        sampler=SDESampler(num_steps=4, shift=3.0, guidance=2.0),
        reward=JpegCompressibility(),
        strategy=JaggStrategy(window=2, mode="cached"),
        grpo=GRPOConfig(beta=0.04, train_fraction=1.0, micro_batch_size=2, max_grad_norm=0.0),
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
        group_size=GROUP_SIZE,
        seed=3,
        sample_every=0,
    )
    data = PromptDataModule(prompts_per_step=PROMPTS_PER_STEP, group_size=GROUP_SIZE, seed=5)
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp_spawn" if devices > 1 else "auto", max_steps=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=data)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp_records")
    run_first_step(out, devices=1)
    run_first_step(out, devices=2)
    return out


def load(records: Path, name: str, world: int, rank: int):
    return torch.load(records / f"{name}_w{world}_r{rank}.pt")


def test_two_processes_give_the_single_process_gradient(records: Path) -> None:
    single = load(records, "grad", 1, 0)
    assert single.abs().max() > 0  # the comparison below means something
    for rank in (0, 1):
        torch.testing.assert_close(load(records, "grad", 2, rank), single, rtol=1e-4, atol=1e-7)


def test_one_gradient_sync_per_optimizer_step(records: Path) -> None:
    assert load(records, "syncs", 2, 0) == load(records, "syncs", 2, 1) == 1


def test_advantages_are_computed_over_whole_groups(records: Path) -> None:
    single = load(records, "advantages", 1, 0)
    assert single.shape == (PROMPTS_PER_STEP * GROUP_SIZE,) and single.abs().sum() > 0
    for rank in (0, 1):  # with 2 processes each group lies on one rank; the advantages still match
        torch.testing.assert_close(load(records, "advantages", 2, rank), single)


def test_ranks_draw_distinct_noise_that_tiles_the_single_process_batch(records: Path) -> None:
    a, b = load(records, "noise", 2, 0), load(records, "noise", 2, 1)
    assert a.shape[0] == b.shape[0] == PROMPTS_PER_STEP * GROUP_SIZE // 2
    both = torch.cat([a, b]).flatten(1)
    assert torch.cdist(both, both).add(torch.eye(len(both)) * 1e9).min() > 1.0  # no two samples share noise
    torch.testing.assert_close(torch.cat([a, b]), load(records, "noise", 1, 0))


def test_shard_noise_rows_do_not_depend_on_the_split() -> None:
    whole = shard_noise((8, 3), torch.Generator().manual_seed(0))
    parts = [shard_noise((2, 3), torch.Generator().manual_seed(0), (r, 4)) for r in range(4)]
    assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(ValueError, match="outside a world"):
        shard_noise((2, 3), None, (4, 4))


def test_ddp_cpu_run_through_the_cli(tmp_path: Path) -> None:
    run = tmp_path / "ddp"
    proc = subprocess.run(
        [sys.executable, "-m", "jagg_lab.train", "+experiment=jagg_w4", "trainer=ddp_cpu", "trainer.devices=2",
         "trainer.max_steps=2", "sample_every=1", f"hydra.run.dir={run}", *TINY],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Starting with 2 processes" in proc.stderr + proc.stdout
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [1, 2]  # one row per step: only rank 0 logs
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "policy.safetensors").is_file()
    assert len(list((run / "samples").glob("*.png"))) == 2


def test_batch_that_does_not_split_over_processes_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "bad"
    proc = subprocess.run(
        [sys.executable, "-m", "jagg_lab.train", "trainer=ddp_cpu", "trainer.devices=3", f"hydra.run.dir={run}", *TINY],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0 and "trainer.devices * trainer.num_nodes = 3" in proc.stderr
    assert not run.exists()
