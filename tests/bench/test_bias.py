"""`python -m jagg_lab.bench bias` on a tiny setting: every row has its columns; bad input is
refused before any model is built."""
import json

import pytest

from jagg_lab.bench import bias, common
from jagg_lab.bench.__main__ import main

TINY = ["policy=dit_xs", "policy.checkpoint=null", "data.prompts_per_step=1", "data.group_size=4",
        "grpo.micro_batch_size=2", "sampler.num_steps=6", "grpo.train_fraction=1.0"]


def test_bias_report_has_every_column(tmp_path):
    out = tmp_path / "bias.json"
    code = main(["bias", f"out={out}", "n_rollouts=4", "strategies=[jagg,jagg_cv,jagg_routed]", "windows=[3]",
                 "routed_thresholds=[-1,1,0.5]", f"overrides=[{','.join(TINY)}]"])
    assert code == 0
    report = json.loads(out.read_text())
    rows = {row["strategy"]: row for row in report["rows"] if row["strategy"] != "jagg_routed"}
    routed = {row["cos_threshold"]: row for row in report["rows"] if row["strategy"] == "jagg_routed"}
    assert set(rows) == {"full", "jagg", "jagg_cv"} and set(routed) == {-1, 1, 0.5}
    # threshold -1 routes every window of 3 steps (it is jagg), threshold 1 none (it is full)
    assert routed[-1]["jagg_frac_per_rollout"] == 1 and routed[-1]["backward_items_per_rollout"] == 4 * 2
    assert routed[1]["jagg_frac_per_rollout"] == 0 and routed[1]["backward_items_per_rollout"] == 6 * 2
    rows["jagg_routed"] = routed[0.5]
    assert rows["full"]["backward_items_per_rollout"] == 6 * 2  # 6 steps, 2 micro-batches
    assert rows["jagg"]["backward_items_per_rollout"] == 4 * 2  # windows [0..2], [3..5]
    assert rows["jagg_cv"]["backward_items_per_rollout"] == 6 * 2
    assert 0 <= rows["jagg_routed"]["jagg_frac_per_rollout"] <= 1
    for name in ("jagg", "jagg_cv", "jagg_routed"):
        assert all(key in rows[name] for key in ("z", "halves_cosine", "bias_over_mean_full", "mean_cosine", "rel_error",
                                                   "worst_over_mean", "rollout_kurtosis", "coord_kurtosis"))
    assert report["command"].startswith("python -m jagg_lab.bench bias") and "n_rollouts=4" in report["command"]
    assert report["no_bias_z"] == 1.0 and report["rows"][0]["window"] == 1 and report["rollouts_done"] == 4


def test_a_window_pinned_to_a_strategy_gives_it_one_row(tmp_path):
    out = tmp_path / "bias.json"
    code = main(["bias", f"out={out}", "n_rollouts=4", "strategies=[jagg_causal:3,jagg_causal:6,subsample:6,jagg_causal_open]",
                 "windows=[2]", f"overrides=[{','.join(TINY)}]"])
    assert code == 0
    rows = {(row["strategy"], row["window"]): row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("full", 1), ("jagg_causal", 3), ("jagg_causal", 6), ("subsample", 6), ("jagg_causal_open", 2)}
    assert rows["jagg_causal", 3]["backward_items_per_rollout"] == 4 * 2  # knots 0, 2, 3, 5; 2 micro-batches
    assert rows["jagg_causal", 6]["backward_items_per_rollout"] == 2 * 2  # knots 0, 5
    assert rows["subsample", 6]["backward_items_per_rollout"] == 2 * 2
    assert rows["jagg_causal_open", 2]["backward_items_per_rollout"] == 3 * 2  # knots 0, 2, 4


@pytest.mark.parametrize("argv, key", [
    (["strategies=[jagg,nope]"], "strategies"),
    (["strategies=[jagg:1]"], "strategies"),
    (["strategies=[nope:4]"], "strategies"),
    (["windows=[1]"], "windows"),
    (["n_rollouts=2"], "n_rollouts"),
    (["routed_thresholds=[0.5,2]"], "routed_thresholds"),
    (["overrides=[sampler.noise_level=-1]"], "noise_level"),
    (["overrides=[grpo.micro_batch_size=7]"], "micro_batch_size"),
])
def test_bad_input_is_refused_before_any_model_is_built(argv, key, capsys, monkeypatch):
    monkeypatch.setattr(common, "GRPOModule", lambda *a, **k: pytest.fail("a model was built"))
    assert main(["bias", *argv]) == 2
    assert key in capsys.readouterr().err


def test_existing_output_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "bias.json"
    out.write_text("{}")
    assert main(["bias", f"out={out}"]) == 2
    assert "out" in capsys.readouterr().err and out.read_text() == "{}"
