"""`python -m jagg_lab.bench bias` on a tiny setting: every row has its columns; bad input is
refused before any model is built."""
import json

import pytest
import torch

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


def test_window_detail_splits_the_step_into_windows_and_correlates_score_with_error(tmp_path):
    """Per window of the jagg rows: full's window gradients add up to the step's, a window of 1
    or 2 steps is exact for JAGG, and the score / error correlation is reported per W."""
    varied = [*TINY, "reward=jpeg"]  # the shapes verifier scores a random policy's samples alike: no advantage
    setting = bias._setting(bias.BiasArgs(overrides=varied, n_rollouts=4))
    _, module, data = setting
    rollout, advantages = common.training_rollout(module, data, next(iter(data.train_dataloader())), 0, "cpu")
    module.policy.train()
    whole, _, _ = bias._gradient(bias.FullStrategy(), module, rollout, advantages, "cpu")
    parts = bias.window_gradients(module, rollout, advantages, 4, micro_batches=2)
    assert [p["steps"] for p in parts] == [[0, 1, 2, 3], [4, 5]]
    assert torch.allclose(sum(p["f"] for p in parts), whole, atol=1e-6, rtol=1e-4)
    assert torch.allclose(parts[1]["g"], parts[1]["f"], atol=1e-6, rtol=1e-4) and parts[1]["score"] == 1.0
    assert not torch.allclose(parts[0]["g"], parts[0]["f"], atol=1e-6, rtol=1e-4) and -1 <= parts[0]["score"] <= 1
    assert bias.score_error_correlation([(0.9, 0.1), (0.5, 0.4), (0.1, 0.8)])["spearman"] == pytest.approx(-1.0)
    out = tmp_path / "bias.json"
    # 5 rollouts: the report after the 4th is written too (a partial one), as a long run writes them
    assert main(["bias", f"out={out}", "n_rollouts=5", "strategies=[jagg,subsample]", "windows=[4]", "window_detail=true",
                 f"overrides=[{','.join(varied)}]"]) == 0
    report = json.loads(out.read_text())
    assert [(w["window"], w["position"], w["steps"]) for w in report["windows"]] == [(4, 0, [0, 1, 2, 3]), (4, 1, [4, 5])]
    assert report["windows"][1]["rel_error"] < 1e-3 and report["score_error_correlation"]["4"]["pairs"] == 10
    assert report["rollouts_done"] == 5 and all(row.get("rollouts", 5) == 5 for row in report["rows"])
    # four windows per rollout: the per-window loop must not disturb the rollout count (partial reports)
    many = tmp_path / "many.json"
    assert main(["bias", f"out={many}", "n_rollouts=5", "strategies=[jagg]", "windows=[2]", "window_detail=true",
                 f"overrides=[{','.join([*varied, 'sampler.num_steps=8'])}]"]) == 0
    assert json.loads(many.read_text())["rollouts_done"] == 5


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
