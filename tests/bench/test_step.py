"""`python -m jagg_lab.bench step` on a tiny setting: every experiment x rollout setting, its calls,
seconds that add up to the step, paired rewards; bad input refused before any model is built."""
import json
import statistics

import pytest

from jagg_lab.bench import common
from jagg_lab.bench.__main__ import main
from jagg_lab.bench.step import RolloutSetting, parse_rollout

TINY = ["data.prompts_per_step=1", "data.group_size=4", "grpo.micro_batch_size=2", "sampler.num_steps=6",
        "grpo.train_fraction=0.5", "grpo.optimizer_steps_per_rollout=2"]


def test_rollout_settings_parse():
    assert parse_rollout("sde") == RolloutSetting("sde")
    assert parse_rollout("euler:1") == RolloutSetting("euler:1", "euler", 1)
    assert parse_rollout("heun+compile") == RolloutSetting("heun+compile", "heun", None, True)
    for bad in ("rk4:2", "euler:0", "euler:x", "sde:2", "sde+fast"):
        with pytest.raises(ValueError, match="rollouts"):
            parse_rollout(bad)


def test_every_experiment_and_rollout_setting_gets_a_row(tmp_path):
    out = tmp_path / "step.json"
    code = main(["step", f"out={out}", "experiments=[full,jagg_causal_w4]", "rollouts=[sde,euler:1,heun:2,ab2]",
                 "reference=full/sde", "rounds=2", "warmup=0", f"overrides=[{','.join(TINY)}]"])
    assert code == 0
    report = json.loads(out.read_text())
    rows = {(r["experiment"], r["rollout"]): r for r in report["rows"]}
    assert len(rows) == 8
    # 3 SDE steps are trained; the other 3 by the SDE, 1 Euler step, 2 Heun steps (3 calls: the last is Euler), 3 AB2 steps
    assert {spec: rows["full", spec]["rollout_calls"] for spec in ("sde", "euler:1", "heun:2", "ab2")} == {
        "sde": 6, "euler:1": 4, "heun:2": 6, "ab2": 6}
    assert rows["full", "sde"]["rollout_rows"] == 6 * 4 * 2  # CFG: two rows per sample and call
    assert rows["full", "sde"]["backward_items"] == 3 and rows["jagg_causal_w4", "sde"]["backward_items"] == 2  # per optimizer step
    for row in rows.values():
        assert row["step_s"] == pytest.approx(row["rollout_s"] + row["reward_s"] + row["gradient_s"])
        assert row["gradient_s"] == pytest.approx(statistics.median(row["rounds_s"]["gradient"]) / 2)  # 2 optimizer steps per rollout
        assert row["step_speedup"] == pytest.approx(rows["full", "sde"]["step_s"] / row["step_s"])
        assert 0 <= row["reward_mean"] <= 1
    assert rows["full", "sde"]["reward_vs_reference"] == 0 and rows["full", "sde"]["step_speedup"] == 1
    # the rollout of a setting is shared by the experiments: the same rewards
    assert rows["full", "euler:1"]["reward_mean"] == rows["jagg_causal_w4", "euler:1"]["reward_mean"]
    assert report["command"].startswith("python -m jagg_lab.bench step") and report["reference"] == "full/sde"


@pytest.mark.parametrize("argv, key", [
    (["rollouts=[sde,sde]"], "rollouts"),
    (["rollouts=[rk4:2]"], "rollouts"),
    (["reference=full/euler:9"], "reference"),
    (["overrides=[grpo.train_fraction=1.0]"], "no tail"),
    (["experiments=[full,nope]"], "nope"),
    (["rounds=0"], "rounds"),
    (["experiments=[full,nft]", "overrides=[++objective.beta=-1]"], "experiments: full: objective:"),
])
def test_bad_input_is_refused_before_any_model_is_built(argv, key, capsys, monkeypatch):
    monkeypatch.setattr(common, "GRPOModule", lambda *a, **k: pytest.fail("a model was built"))
    assert main(["step", *argv]) == 2
    assert key in capsys.readouterr().err


def test_existing_output_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "step.json"
    out.write_text("{}")
    assert main(["step", f"out={out}"]) == 2
    assert "out" in capsys.readouterr().err and out.read_text() == "{}"


def test_precisions_run_side_by_side_and_limit_counts_flops_against_each_peak(tmp_path, capsys):
    out = tmp_path / "step.json"
    code = main(["step", f"out={out}", "experiments=[full,subsample_w6]", "rollouts=[sde]", "precisions=[32-true,bf16-mixed]",
                 "limit=true", "rounds=1", "warmup=0", f"overrides=[{','.join([*TINY[:4], 'grpo.train_fraction=1.0'])}]"])
    assert code == 0
    report = json.loads(out.read_text())
    rows = {(r["experiment"], r["precision"]): r for r in report["rows"]}
    assert set(rows) == {(e, p) for e in ("full", "subsample_w6") for p in ("32-true", "bf16-mixed")}
    assert report["reference"] == "full/sde/32-true"
    for row in rows.values():
        assert row["clip_frac"] == 0 and row["ratio_mean"] == 1  # on-policy: no clipping in either precision
        assert row["gradient_peak_share"] == pytest.approx(
            row["gradient_gflop"] / row["gradient_s"] / report["limit"]["peaks"][row["precision"]]["peak"])
    # a precision changes no FLOP count; a gradient phase's FLOPs follow its backward items
    assert rows["full", "32-true"]["gradient_gflop"] == rows["full", "bf16-mixed"]["gradient_gflop"] > 0
    full, sub = rows["full", "32-true"], rows["subsample_w6", "32-true"]
    assert sub["backward_items"] < full["backward_items"]
    assert full["gradient_gflop"] / sub["gradient_gflop"] == pytest.approx(full["backward_items"] / sub["backward_items"])
    # one rollout call's DiT projections, as the rollout batches them: 4 samples x 2 CFG rows x 73 tokens
    # (64 image patches, 8 prompt tokens and a summary token), beside the large square
    peaks = report["limit"]["peaks"]
    assert set(peaks) == {"32-true", "bf16-mixed"}
    assert sorted(peaks["bf16-mixed"]["gflops"]) == ["4096x4096x4096", "584x128x128", "584x128x384", "584x128x512", "584x512x128"]
    # the machine's bf16 against float32, and whether it has bf16 instructions at all (what the default precision follows)
    ratio = report["limit"]["bf16_over_float32"]
    assert ratio["peak"] == pytest.approx(peaks["bf16-mixed"]["peak"] / peaks["32-true"]["peak"]) and ratio["square"] > 0
    assert report["limit"]["cpu_bf16"] == report["machine"]["cpu_bf16"]
    printed = capsys.readouterr().out
    assert "share of peak" in printed and "native bf16 instructions" in printed


def test_a_bad_precision_is_refused(capsys):
    assert main(["step", "precisions=[bf16-true]"]) == 2
    assert "precisions" in capsys.readouterr().err


def test_experiments_with_their_own_rollouts_are_timed_beside_the_shared_ones(tmp_path):
    """A forward-process objective (ODE rollouts) and a moving SDE window sample their own rollouts
    of the same prompts: one row each, rollout 'own', with the training step's own gradient phase."""
    out = tmp_path / "step.json"
    code = main(["step", f"out={out}", "experiments=[full,nft,awm,flow_grpo_fast]", "rollouts=[sde]", "rounds=1",
                 "warmup=0", f"overrides=[{','.join(TINY)}]"])
    assert code == 0
    rows = {r["experiment"]: r for r in json.loads(out.read_text())["rows"]}
    assert {name: rows[name]["rollout"] for name in rows} == {"full": "sde", "nft": "own", "awm": "own", "flow_grpo_fast": "own"}
    assert {name: rows[name]["rollout_calls"] for name in rows} == {"full": 6, "nft": 6, "awm": 6, "flow_grpo_fast": 6}
    # per optimizer step (2 per rollout): full 3 trained steps; NFT int(6 * 0.99) = 5 levels; AWM 6; the window 2
    assert {name: rows[name]["backward_items"] for name in rows} == {"full": 3, "nft": 5, "awm": 6, "flow_grpo_fast": 2}
    # the shared setting trains half the steps: the forward-process objectives ignore that, and the report says so
    notes = json.loads(out.read_text())["notes"]
    for name in ("nft", "awm"):
        assert f"not used: {name}: grpo.train_fraction=0.5: not used by objective={name}" in "\n".join(notes)
    for row in rows.values():
        assert row["step_s"] == pytest.approx(row["rollout_s"] + row["reward_s"] + row["gradient_s"])
        assert 0 <= row["reward_mean"] <= 1


def test_bench_arms_refuses_an_experiment_with_its_own_rollouts(capsys):
    assert main(["arms", "experiments=[full,nft]"]) == 2
    assert "nft samples its own rollouts" in capsys.readouterr().err
    assert main(["step", "experiments=[mixgrpo,full]"]) == 2
    assert "put a trajectory experiment first" in capsys.readouterr().err


def test_profile_ranks_each_experiments_ops_by_self_cpu_time(tmp_path, capsys):
    """profile=true: one more step per experiment (shared or own rollouts) under torch.profiler;
    its ops ranked by self CPU time with shares that add up, the matrix products among them."""
    out = tmp_path / "step.json"
    code = main(["step", f"out={out}", "experiments=[full,awm]", "rollouts=[sde]", "rounds=1", "warmup=0", "profile=true",
                 "profile_top=6", f"overrides=[{','.join(TINY)}]"])
    assert code == 0
    profile = json.loads(out.read_text())["profile"]
    assert set(profile) == {"full", "awm"} and profile["awm"]["setting"].startswith("rollout own")
    for prof in profile.values():
        ops = prof["ops"]
        assert len(ops) == 6 and [o["self_cpu_s"] for o in ops] == sorted((o["self_cpu_s"] for o in ops), reverse=True)
        assert 0 < sum(o["share"] for o in ops) <= 1 + 1e-9 and all(o["calls"] >= 1 for o in ops)
        assert 0 < prof["matmul_share"] < 1  # a DiT step is neither all matmul nor none
    assert "of it in matrix products" in capsys.readouterr().out


def test_profile_top_must_keep_an_op(capsys):
    assert main(["step", "profile=true", "profile_top=0"]) == 2 and "profile_top" in capsys.readouterr().err


@pytest.mark.slow  # compiles the policy (about a minute on 2 cores)
def test_compiled_gradient_phase_gets_its_own_row_with_the_same_work(tmp_path):
    """compile_gradient=true: each shared-rollout experiment also runs its gradient phase through a
    torch.compile'd policy on the same rollouts: same backward items and on-policy ratio, a row of its own."""
    out = tmp_path / "step.json"
    code = main(["step", f"out={out}", "experiments=[full,subsample_w6]", "rollouts=[sde]", "rounds=1", "warmup=1",
                 "compile_gradient=true", "limit=true", "overrides=[policy=dit_xs," + ",".join(TINY) + "]"])
    assert code == 0
    rows = {r["experiment"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"full", "subsample_w6", "full+compile", "subsample_w6+compile"}
    for name in ("full", "subsample_w6"):
        eager, compiled = rows[name], rows[f"{name}+compile"]
        assert compiled["gradient_compile"] and not eager["gradient_compile"]
        assert compiled["backward_items"] == eager["backward_items"] and compiled["ratio_mean"] == pytest.approx(1.0)
        assert compiled["gradient_gflop"] == eager["gradient_gflop"] > 0  # the same work, counted once
