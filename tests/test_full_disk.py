"""A full disk while a run writes its checkpoint, a metrics row or the verdict: the previous files
stay whole, nothing half-written is left under a final name, and the run stops with one line
that says the disk is full and what to go on with (`tests.faults POINT N ENOSPC`)."""
import csv
import json
import shlex

import pytest
import torch

from jagg_lab.evaluate import main as evaluate
from tests.test_interrupts import EVERY_STEP, HELDOUT, SMALL, faulty, step_in


def _last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


def test_a_full_disk_while_writing_last_ckpt_keeps_the_previous_one_and_says_what_to_resume(tmp_path):
    run = tmp_path / "run"
    proc = faulty("last_write", 3, "ENOSPC", *SMALL, "trainer.max_steps=5", EVERY_STEP, f"hydra.run.dir={run}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = _last_line(proc)
    assert line.startswith("jagg_lab.train: the disk is full (No space left on device writing ")
    assert f"resume={run / 'checkpoints' / 'last.ckpt'} hydra.run.dir=NEW_DIR" in line and "Traceback" not in proc.stderr
    assert step_in(run / "checkpoints" / "last.ckpt") == 2  # step 3's write failed: step 2's is whole
    assert not list((run / "checkpoints").glob(".*tmp*"))


def test_a_full_disk_while_appending_metrics_leaves_only_whole_rows(tmp_path):
    run = tmp_path / "run"
    proc = faulty("metrics", 2, "ENOSPC", *SMALL, "trainer.max_steps=5", EVERY_STEP, f"hydra.run.dir={run}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "the disk is full" in _last_line(proc) and "metrics.csv" in _last_line(proc)
    text = (run / "metrics.csv").read_text()
    assert text.endswith("\n") and "7,0.25," not in text
    rows = list(csv.DictReader(text.splitlines()))
    assert rows and all(None not in row.values() and None not in row for row in rows)  # every row whole


def test_a_full_disk_while_writing_the_verdict_leaves_no_half_file_and_says_how_to_grade(tmp_path):
    run = tmp_path / "run"
    overrides = [o for o in SMALL if not o.startswith("heldout.")]
    proc = faulty("verdict_write", 1, "ENOSPC", *overrides, *HELDOUT, "trainer.max_steps=2", f"hydra.run.dir={run}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = _last_line(proc)
    assert "after training had finished" in line and "python -m jagg_lab.evaluate" in line
    assert not (run / "heldout_final.json").exists() and not list(run.glob(".heldout_final.json*"))
    command = shlex.split(line.split("grade it with: ", 1)[1])
    out = tmp_path / "verdict.json"
    assert evaluate([*command[3:], f"out={out}"]) == 0  # the line's command grades the trained policy against the base
    verdict = json.loads(out.read_text())
    assert verdict["args"]["n_samples"] == 6 and "strict_gain" in verdict["gain_over_base"]
    assert torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 2


@pytest.mark.parametrize("point", ["nowhere"])
def test_an_unknown_full_disk_point_is_refused(point):
    from tests.faults import install_full_disk
    with pytest.raises(ValueError, match="nowhere"):
        install_full_disk(point, 1)
