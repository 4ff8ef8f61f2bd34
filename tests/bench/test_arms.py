"""`python -m jagg_lab.bench arms` on a tiny setting: each experiment's strategy from its own
config, its backward items per step, times side by side; bad input refused before any model is built."""
import json
import statistics

import pytest

from jagg_lab.bench import common
from jagg_lab.bench.__main__ import main

TINY = ["data.prompts_per_step=1", "data.group_size=4", "grpo.micro_batch_size=2", "sampler.num_steps=6",
        "grpo.train_fraction=1.0", "grpo.optimizer_steps_per_rollout=2"]


def test_each_experiment_runs_its_own_strategy_on_the_shared_rollouts(tmp_path):
    out = tmp_path / "arms.json"
    code = main(["arms", f"out={out}", "experiments=[jagg_w4,full,subsample_w4,jagg_cv_w4]", "reference=full",
                 "rounds=2", "warmup=0", f"overrides=[{','.join(TINY)}]"])
    assert code == 0
    report = json.loads(out.read_text())
    rows = {row["experiment"]: row for row in report["rows"]}
    assert list(rows) == ["jagg_w4", "full", "subsample_w4", "jagg_cv_w4"]
    # 6 trained steps in 2 micro-batches, one per optimizer step; windows of 4 tile them as [0..3], [4, 5]
    assert {name: row["backward_items"] for name, row in rows.items()} == {
        "full": 6, "jagg_w4": 2 + 2, "subsample_w4": 2 + 2, "jagg_cv_w4": 3 + 2}
    assert rows["jagg_cv_w4"]["strategy"]["_target_"].endswith("JaggCVStrategy") and rows["jagg_w4"]["strategy"]["window"] == 4
    assert rows["jagg_w4"]["items_vs_reference"] == pytest.approx(4 / 6)
    for row in rows.values():  # seconds per optimizer step: half of a rollout's
        assert len(row["gradient_s_rounds"]) == 2 and row["gradient_s"] == pytest.approx(statistics.median(row["gradient_s_rounds"]) / 2)
        assert row["time_vs_reference"] == pytest.approx(row["gradient_s"] / rows["full"]["gradient_s"])
    assert report["reference"] == "full" and report["micro_batches"] == 2 and report["optimizer_steps_per_rollout"] == 2
    assert report["command"].startswith("python -m jagg_lab.bench arms") and "rounds=2" in report["command"]


@pytest.mark.parametrize("argv, key", [
    (["experiments=[full,full]"], "experiments"),
    (["experiments=[full,nope]"], "nope"),
    (["reference=jagg_w8"], "reference"),
    (["rounds=0"], "rounds"),
    (["experiments=[jagg_w4,sweep_resolution]"], "policy.checkpoint"),
    (["overrides=[grpo.micro_batch_size=7]"], "micro_batch_size"),
    (["overrides=[trainer.precision=bf16-true]"], "trainer.precision"),
])
def test_bad_input_is_refused_before_any_model_is_built(argv, key, capsys, monkeypatch):
    monkeypatch.setattr(common, "GRPOModule", lambda *a, **k: pytest.fail("a model was built"))
    assert main(["arms", *argv]) == 2
    assert key in capsys.readouterr().err


def test_existing_output_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "arms.json"
    out.write_text("{}")
    assert main(["arms", f"out={out}"]) == 2
    assert "out" in capsys.readouterr().err and out.read_text() == "{}"
