"""Every checkpoint a user names loads without running code: a file whose unpickling would
create a marker file is refused before any work, with one line naming the key and the file,
and leaves no run directory. The project's own checkpoints still load (tests/test_train_cli.py,
tests/test_fsdp.py and tests/test_distributed.py resume them)."""
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from jagg_lab.checkpointing import UNSAFE, load_checkpoint
from jagg_lab.evaluate import main as evaluate
from jagg_lab.rundir import ConfigError
from jagg_lab.sharding import METADATA, main as consolidate, read_sharded_checkpoint
from jagg_lab.train import build
from tests.conftest import randomized_policy
from tests.evaluation.conftest import WRAPPED_TARGET, WrappedDiT, write_run
from tests.test_train_cli import TINY, read_rows, train

DIT_XS = {"_target_": "jagg_lab.policies.DiTPolicy", "size": "XS", "resolution": 16, "checkpoint": None}


class Payload:
    """Unpickled, runs a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def crafted_checkpoint(path, marker):
    """A training checkpoint in every respect but one entry that runs a command when unpickled."""
    torch.save({"state_dict": {"policy.x": torch.zeros(1)}, "optimizer_states": [], "rollouts_done": 0,
                "global_step": 0, "payload": Payload(marker)}, path)
    return path


def crafted_sharded(directory, marker, where):
    """A sharded checkpoint directory whose `.metadata`, `meta.pt` or a shard's non-tensor entry runs a command."""
    entry = Payload(marker) if where == "shard" else 1
    dcp.save({"state_dict": {"policy.x": torch.zeros(4)}, "counter": entry}, storage_writer=FileSystemWriter(directory),
             no_dist=True)
    meta = {"rollouts_done": 0, "global_step": 0, **({"payload": Payload(marker)} if where == "meta" else {})}
    torch.save(meta, directory / METADATA)
    if where == ".metadata":
        with open(directory / ".metadata", "wb") as f:
            pickle.dump(Payload(marker), f)
    return directory


def test_the_payload_works_when_unpickled_unrestricted(tmp_path):
    """The crafted files below are real exploits: unrestricted, loading one runs the command."""
    path = crafted_checkpoint(tmp_path / "evil.ckpt", tmp_path / "marker")
    torch.load(path, weights_only=False)  # what read_checkpoint did before
    assert (tmp_path / "marker").exists()


@pytest.mark.parametrize("key", ["resume", "policy.checkpoint"])
def test_a_checkpoint_that_would_run_code_is_refused(hydra_cfg, tmp_path, key):
    """resume=, and policy.checkpoint= (through DiTPolicy.load)."""
    evil = crafted_checkpoint(tmp_path / "evil.ckpt", tmp_path / "marker")
    with pytest.raises(ConfigError, match=f"{key}: {evil} {UNSAFE} \\(posix.system\\)"):
        build(hydra_cfg(["policy=dit_xs", f"{key}={evil}"]), tmp_path / "run")
    assert not (tmp_path / "marker").exists() and not (tmp_path / "run").exists()


def test_the_cli_refuses_it_in_one_line_and_leaves_no_run_directory(tmp_path):
    evil = crafted_checkpoint(tmp_path / "evil.ckpt", tmp_path / "marker")
    proc = train(f"resume={evil}", f"hydra.run.dir={tmp_path / 'r'}", *TINY, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("jagg_lab.train:")]
    assert f"resume: {evil} {UNSAFE}" in line
    assert not (tmp_path / "marker").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("where", [".metadata", "meta", "shard"])
def test_sharded_checkpoints_are_checked_part_by_part(hydra_cfg, tmp_path, where):
    evil = crafted_sharded(tmp_path / "last.ckpt", tmp_path / "marker", where)
    with pytest.raises(ConfigError, match=f"resume: {evil}.* {UNSAFE}"):
        read_sharded_checkpoint(evil)
    with pytest.raises(ConfigError, match=UNSAFE):  # a directory resume= is read as a sharded checkpoint
        build(hydra_cfg(["policy=dit_xs", f"resume={evil}"]), tmp_path / "run")
    assert consolidate([f"checkpoint={evil}"]) == 2  # python -m jagg_lab.sharding
    assert not (tmp_path / "marker").exists() and not (tmp_path / "run").exists()
    assert not (tmp_path / "last.full.ckpt").exists()


def test_a_clean_sharded_checkpoint_passes_the_checks(tmp_path):
    clean = crafted_sharded(tmp_path / "last.ckpt", tmp_path / "marker", where=None)
    assert read_sharded_checkpoint(clean)["rollouts_done"] == 0


@pytest.mark.parametrize("policy", ["dit", "generic"])
def test_evaluate_refuses_a_run_checkpoint_that_would_run_code(tmp_path, capsys, policy):
    """run=RUN/checkpoints/X.ckpt: through DiTPolicy.load, and through the generic state-dict path."""
    node, module = (DIT_XS, randomized_policy(size="XS", resolution=16)) if policy == "dit" else ({"_target_": WRAPPED_TARGET}, WrappedDiT())
    run = write_run(tmp_path / "run", module, node)
    (run / "checkpoints").mkdir()
    evil = crafted_checkpoint(run / "checkpoints" / "step_000001.ckpt", tmp_path / "marker")
    assert evaluate(["source=policy", f"run={evil}", "n_samples=2", "num_steps=1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(evil) in line and UNSAFE in line
    assert not (tmp_path / "marker").exists()


def test_damaged_and_missing_files_are_named(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=f"resume: {bad} is not a readable checkpoint"):
        load_checkpoint(bad, "resume")
    with pytest.raises(ConfigError, match="resume: no such checkpoint"):
        load_checkpoint(tmp_path / "absent.ckpt", "resume")


@pytest.mark.slow
def test_ddp_checkpoints_still_resume_exactly(tmp_path):
    """trainer=ddp_cpu's own checkpoints pass the checks and resume to the uninterrupted rows
    (trainer=cpu: tests/test_train_cli.py; trainer=fsdp_cpu: tests/test_fsdp.py)."""
    ddp = ["trainer=ddp_cpu", "trainer.devices=2", "reward=jpeg", "optimizer.lr=1e-3", "heldout.n_samples=0",
           "sample_every=0", "checkpoint_every=1", "trainer.max_steps=2", *TINY]
    train(*ddp, f"hydra.run.dir={tmp_path / 'straight'}")
    train(*ddp, f"resume={tmp_path / 'straight' / 'checkpoints' / 'step_000001.ckpt'}", f"hydra.run.dir={tmp_path / 'resumed'}")
    straight, rows = read_rows(tmp_path / "straight" / "metrics.csv"), read_rows(tmp_path / "resumed" / "metrics.csv")
    keys = [k for k in straight[1] if not k.startswith("time_")]
    assert [int(r["step"]) for r in rows] == [2] and {k: rows[0][k] for k in keys} == {k: straight[1][k] for k in keys}


# ---- a sharded save killed between its renames; temporary files of killed writes --------------------
def _sharded(path, payload):
    path.mkdir()
    (path / "shard").write_text(payload)


@pytest.mark.parametrize("kill_after", [0, 1, 2])
def test_every_kill_point_of_a_sharded_publish_leaves_the_newest_whole_checkpoint(tmp_path, monkeypatch, kill_after):
    """Kill the swap after 0, 1 or 2 of its renames (and before the stale copy is removed): the
    mend before the next read or write puts the new checkpoint in place (it was complete before
    the renames began) and leaves no .old behind."""
    import jagg_lab.checkpointing as checkpointing
    last = tmp_path / "last.ckpt"
    _sharded(last, "step 2")
    _sharded(tmp_path / ".last.ckpt.tmp", "step 3")
    real, calls = os.replace, []

    def killed_replace(src, dst):
        if len(calls) == kill_after:
            raise KeyboardInterrupt("killed")
        calls.append(dst)
        real(src, dst)

    monkeypatch.setattr(checkpointing.os, "replace", killed_replace)
    monkeypatch.setattr(checkpointing.shutil, "rmtree", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt("killed")))
    with pytest.raises(KeyboardInterrupt):
        checkpointing.publish_dir(last)
    monkeypatch.undo()
    assert last.exists() == (kill_after != 1)  # only a kill between the renames leaves no last.ckpt
    said = checkpointing.recover_published(last)
    assert (said is None) == (kill_after == 0)
    expected = "step 2" if kill_after == 0 else "step 3"  # before the first rename the new one is not yet published
    assert (last / "shard").read_text() == expected and not (tmp_path / ".last.ckpt.old").exists()
    assert checkpointing.recover_published(last) is None  # nothing left to mend


def test_with_both_copies_gone_the_previous_checkpoint_is_put_back(tmp_path):
    from jagg_lab.checkpointing import recover_published
    _sharded(tmp_path / ".last.ckpt.old", "step 2")
    assert "previous checkpoint" in recover_published(tmp_path / "last.ckpt")
    assert (tmp_path / "last.ckpt" / "shard").read_text() == "step 2"


def test_a_resume_deletes_the_temporary_files_of_killed_writes_and_keeps_live_ones(tmp_path, caplog):
    import subprocess
    import sys as _sys

    from jagg_lab.train import mend_checkpoint_dir
    dead = subprocess.run([_sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / "last.ckpt").write_bytes(b"x")
    (tmp_path / f".last.ckpt.tmp-{dead_pid}").write_bytes(b"half")
    (tmp_path / f".step_000002.ckpt.tmp-{dead_pid}").write_bytes(b"half")
    (tmp_path / f".last.ckpt.tmp-{os.getpid()}").write_bytes(b"being written")
    (tmp_path / ".notes.tmp-x").write_bytes(b"not ours")
    with caplog.at_level("WARNING"):
        mend_checkpoint_dir(tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["last.ckpt", f".last.ckpt.tmp-{os.getpid()}", ".notes.tmp-x"])
    assert "deleted 2 temporary file(s)" in caplog.text
