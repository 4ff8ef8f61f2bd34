"""The daily loop through the CLI: TensorBoard, held-out evaluation and summary, interrupts
and resume, bad inputs refused before any work."""
import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from jagg_lab.worlds.shapes import CATEGORIES
from tests.test_train_cli import REPO, read_rows, train

SMALL = ["policy=dit_xs", "data.prompts_per_step=1", "data.group_size=4", "grpo.micro_batch_size=4",
         "sampler.num_steps=4"]
HELDOUT = ["heldout.n_samples=6", "heldout.num_steps=2", "heldout.every=1"]


def test_tensorboard_heldout_and_summary(tmp_path):
    run = tmp_path / "run"
    proc = train("trainer.max_steps=2", "sample_every=1", f"hydra.run.dir={run}", *SMALL, *HELDOUT,
                 "heldout.final_n_samples=7", "heldout.final_seed=3")
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert {"reward_mean", "loss", "grad_norm", "heldout/dense_score", "heldout/dense_gain"} <= set(tags["scalars"])
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2]
    assert [e.step for e in events.Images("samples")] == [1, 2]
    assert "group_size" in (run / "tensorboard" / "hparams.yaml").read_text()  # the config as hyper-parameters
    # held-out: the base at step 0, then every step, all paired with the base
    rows = read_rows(run / "heldout.csv")
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    # each category's strict accuracy (6 samples: one per category) averages to the overall one
    per_category = [float(rows[-1][f"strict_{c}"]) for c in CATEGORIES]
    assert sum(per_category) / 6 == pytest.approx(float(rows[-1]["strict_accuracy"]))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["heldout"]["n_samples"] == 6 and "dense_gain_se" in summary["heldout"]
    assert summary["next"].startswith("python -m jagg_lab.evaluate")
    # the verdict: the final policy against the base on its own set, paired sample by sample
    verdict = json.loads((run / "heldout_final.json").read_text())
    assert verdict["step"] == 2 and verdict["final"]["args"]["n_samples"] == 7 and verdict["base"]["args"]["seed"] == 3
    diffs = [a - b for a, b in zip(verdict["final"]["per_sample"]["dense"], verdict["base"]["per_sample"]["dense"])]
    assert verdict["dense_gain"] == pytest.approx(sum(diffs) / 7)
    assert summary["heldout_final"]["dense_gain"] == pytest.approx(verdict["dense_gain"]) and "held-out verdict" in proc.stderr + proc.stdout
    assert "heldout_final/dense_gain" in tags["scalars"]
    log = (run / "train.log").read_text()
    assert "step 2/2 [" in log and "summary: next:" in log and "Epoch" not in proc.stdout + proc.stderr
    assert "Tip:" not in proc.stdout + proc.stderr and "manual optimization" not in proc.stdout + proc.stderr
    grid_text = (run / "samples" / "step_000001.txt").read_text().splitlines()
    assert len(grid_text) == 1 + 4 and grid_text[1].split("\t")[0] == "0"


def test_sigint_after_the_first_step_leaves_a_resumable_checkpoint_and_resume_is_exact(tmp_path):
    common = ["reward=jpeg", "optimizer.lr=1e-3", "heldout.n_samples=0", "progress.interval_s=0", *SMALL]
    first = tmp_path / "first"
    proc = subprocess.Popen([sys.executable, "-m", "jagg_lab.train", *common, "trainer.max_steps=200",
                             f"hydra.run.dir={first}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((first / "metrics.csv").is_file() and read_rows(first / "metrics.csv")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    last = first / "checkpoints" / "last.ckpt"
    assert last.is_file() and (first / "policy.safetensors").is_file()
    step = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert step == len(read_rows(first / "metrics.csv")) >= 1
    summary = json.loads((first / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and f"resume={last}" in summary["next"]

    train(*common, f"trainer.max_steps={step + 2}", f"resume={last}", f"hydra.run.dir={tmp_path / 'resumed'}")
    train(*common, f"trainer.max_steps={step + 2}", f"hydra.run.dir={tmp_path / 'straight'}")
    keys = ("step", "reward_mean", "loss", "grad_norm")
    resumed = read_rows(tmp_path / "resumed" / "metrics.csv")
    straight = read_rows(tmp_path / "straight" / "metrics.csv")
    assert [int(r["step"]) for r in resumed] == [step + 1, step + 2]
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in straight[step:]]


@pytest.mark.parametrize("override,key", [
    ("optimizer.lr=-1", "optimizer.lr"),
    ("reward=clip", "reward.pretrained"),
    ("trainer.max_steps=0", "trainer.max_steps"),
])
def test_reported_bad_inputs_exit_nonzero_naming_the_key_and_leave_no_directory(tmp_path, override, key):
    proc = train(override, f"hydra.run.dir={tmp_path / 'r'}", *SMALL, check=False)
    assert proc.returncode != 0 and key in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_wandb_logger_builds_offline(hydra_cfg, tmp_path):
    pytest.importorskip("wandb")
    from jagg_lab.train import build

    _, _, trainer = build(hydra_cfg(["policy=dit_xs", "logger=wandb"]), tmp_path / "run")
    assert [type(logger).__name__ for logger in trainer.loggers] == ["CSVLogger", "WandbLogger"]
    assert trainer.loggers[1]._offline
