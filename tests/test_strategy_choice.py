"""experiments/strategy_choice.py on made-up evaluations: per-seed paired gains, their mean and
seed std, the distance to the reference in its std, and the curve in backward items."""
import json
import statistics
import subprocess
import sys

import pytest

from tests.scripts import load_script
from tests.test_train_cli import REPO

ARGS = {"source": "policy", "n_samples": 6, "seed": 2, "split": "heldout", "resolution": 32, "num_steps": 20,
        "guidance": 3.0, "shift": 1.0, "noise_level": 0.0, "batch_size": 64}


def evaluation(strict: list[int], dense: list[float], checkpoint: str) -> dict:
    return {"args": {**ARGS, "checkpoint": checkpoint}, "n_samples": 6, "strict_accuracy": sum(strict) / 6,
            "dense_score": sum(dense) / 6, "per_sample": {"strict": strict, "dense": dense}}


def test_strategy_choice_tabulates_seed_spread_and_equal_item_curves(tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(evaluation([0] * 6, [0.5] * 6, "shipped")))
    gains = {"full": [0.1, 0.2, 0.3], "cheap": [0.05, 0.1]}  # dense gain per seed
    for arm, per_seed in gains.items():
        for seed, g in enumerate(per_seed):
            (tmp_path / f"{arm}_seed{seed}.json").write_text(json.dumps(evaluation([1, 0, 0, 0, 0, 0], [0.5 + g] * 6, arm)))
    curve = tmp_path / "gain.json"
    curve.write_text(json.dumps({"args": {"n_eval": 512, "curve_n_eval": 0},
                                 "runs": [{"arm": "cheap", "seed": s, "steps": 10, "backward_items": 3.0} for s in (0, 1)],
                                 "checkpoints": [{"arm": "cheap", "seed": s, "steps": 10, "strict_gain": 0.0, "dense_gain": 0.1 * (s + 1)}
                                                 for s in (0, 1)]}))
    (tmp_path / "metrics.csv").write_text("step,backward_items,time_gradient_s\n1,5,0.5\n2,3,0.5\n")  # a run's own record wins over gain.json's
    out = tmp_path / "choice"
    cmd = [sys.executable, "experiments/strategy_choice.py", f"base={base}",
           f"finals=[full={tmp_path}/full_seed0.json,cheap={tmp_path}/cheap_seed*.json,full={tmp_path}/full_seed*.json]", f"gains=[{curve}]",
           "items=[full=6]", f"out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arms = {a["arm"]: a for a in json.loads((out / "choice.json").read_text())["arms"]}
    assert arms["full"]["items_per_step"] == 6 and arms["full"]["seeds"] == 3  # items given explicitly win; both globs, a file matched twice counted once
    assert arms["full"]["dense_gain_mean"] == pytest.approx(0.2) and arms["full"]["dense_gain_std"] == pytest.approx(0.1)
    assert arms["cheap"]["seeds"] == 2 and arms["cheap"]["items_vs_reference"] == pytest.approx(4 / 6)
    assert arms["cheap"]["dense_vs_reference_in_std"] == pytest.approx((0.075 - 0.2) / 0.1)
    assert arms["cheap"]["strict_gain_std"] == pytest.approx(statistics.stdev([1 / 6, 1 / 6]))
    (row,) = json.loads((out / "choice.json").read_text())["curve"]
    assert (row["items"], row["dense_gain_mean"]) == (40.0, pytest.approx(0.15))
    # the paired test: cheap's per-sample scores averaged over its 2 seeds (0.575) minus full's over its 3 (0.7)
    (paired,) = json.loads((out / "choice.json").read_text())["paired"]
    assert paired["arm"] == "cheap" and paired["dense_gain"] == pytest.approx(-0.125) and paired["strict_gain"] == 0
    assert "Paired per-sample test against full" in (out / "choice.md").read_text()
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwritten


def test_equal_time_reads_the_reference_curve_at_each_arms_gradient_seconds(tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(evaluation([0] * 6, [0.5] * 6, "shipped")))
    for arm in ("full", "cheap", "slow", "fast"):
        (tmp_path / f"{arm}_seed0").mkdir()  # its curve point is in gain.json below
        (tmp_path / f"{arm}_seed0" / "eval.json").write_text(json.dumps(evaluation([1, 0, 0, 0, 0, 0], [0.6] * 6, arm)))
    # cheap's second seed ran on its own: its run directory keeps the final policy's curve-set score
    run = tmp_path / "cheap_seed1"
    run.mkdir()
    (run / "eval.json").write_text(json.dumps(evaluation([1, 0, 0, 0, 0, 0], [0.6] * 6, "cheap")))
    (run / "eval_curve.json").write_text(json.dumps(evaluation([0] * 6, [0.5 + 0.35] * 6, "cheap")))
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "metrics.csv").write_text("step,backward_items,time_gradient_s\n" + "".join(f"{i},3,0.5\n" for i in range(1, 21)))
    points = [("full", 10, 0.10), ("full", 20, 0.30), ("cheap", 20, 0.25), ("slow", 20, 0.40), ("fast", 20, 0.05)]  # (arm, steps, dense gain)
    curve = tmp_path / "gain.json"
    curve.write_text(json.dumps({"args": {"n_eval": 512, "curve_n_eval": 0}, "runs": [],
                                 "checkpoints": [{"arm": a, "seed": 0, "steps": n, "strict_gain": g / 2, "dense_gain": g}
                                                 for a, n, g in points]
                                 + [{"arm": "cheap", "seed": 1, "steps": 20, "strict_gain": 0, "dense_gain": 0.35}]}))  # counted once
    timed = tmp_path / "arms.json"  # as `bench arms` writes it: seconds per step, side by side
    # slow draws its work: its timed rounds made 4 items per step, its runs 6 (items=[slow=6]): it is charged for 6
    timed.write_text(json.dumps({"setting": {}, "rows": [
        {"experiment": e, "gradient_s": t, "backward_items": n}
        for e, t, n in (("full", 1.0, 6), ("cheap", 0.75, 3), ("slow", 2.0, 4), ("fast", 0.25, 2))]}))
    out = tmp_path / "choice"
    cmd = [sys.executable, "experiments/strategy_choice.py", f"base={base}",
           f"finals=[full={tmp_path}/full_seed*/eval.json,cheap={tmp_path}/cheap_seed*/eval.json,slow={tmp_path}/slow_seed*/eval.json,fast={tmp_path}/fast_seed*/eval.json]",
           f"gains=[{curve}]", "items=[full=6,cheap=3,slow=6,fast=2]", f"curve_base={base}", f"timing={timed}", f"out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "choice.json").read_text())
    arms = {a["arm"]: a for a in result["arms"]}
    assert arms["cheap"]["time_vs_reference"] == pytest.approx(0.75) and arms["full"]["gradient_s_per_step"] == 1.0
    assert arms["slow"]["gradient_s_per_step"] == pytest.approx(3.0)
    assert [r["gradient_s"] for r in result["curve"] if r["arm"] == "full"] == [10.0, 20.0]
    rows = {r["arm"]: r for r in result["equal_time"]}
    assert set(rows) == {"cheap", "slow", "fast"}
    # fast's 20 steps take 5 s: full's 5th step, halfway from the base (0) to its first point (0.10)
    assert rows["fast"]["reference_steps"] == pytest.approx(5) and rows["fast"]["reference_dense_gain_mean"] == pytest.approx(0.05)
    # cheap's 20 steps take 15 s: full's 15th step, halfway between its points at 10 (0.10) and 20 (0.30)
    assert rows["cheap"]["reference_steps"] == pytest.approx(15) and rows["cheap"]["seeds"] == 2
    assert rows["cheap"]["dense_gain_mean"] == pytest.approx((0.25 + 0.35) / 2)
    assert rows["cheap"]["reference_dense_gain_mean"] == pytest.approx(0.20)
    assert rows["cheap"]["reference_strict_gain_mean"] == pytest.approx(0.10)
    # slow's 20 steps take 60 s, past full's last point (20 steps, 20 s): read the other way round, slow's curve at
    # 20 s (its step 6.7, a third of the way from the base to its point at 20: 0.40 / 3) against full's end (0.30)
    assert rows["slow"]["at"] == "full" and rows["slow"]["reference_steps"] == 20 and rows["fast"]["at"] == "arm"
    assert rows["slow"]["steps"] == pytest.approx(20 / 3) and rows["slow"]["gradient_s"] == pytest.approx(20)
    assert rows["slow"]["dense_gain_mean"] == pytest.approx(0.40 / 3) and rows["slow"]["reference_dense_gain_mean"] == pytest.approx(0.30)
    assert "Equal gradient-phase time" in (out / "choice.md").read_text() and (out / "gain_vs_cost.png").stat().st_size > 0
    table = (out / "choice.md").read_text().split("Equal gradient-phase time")[1].strip().splitlines()[2:]
    assert len(table) == 5 and len({line.count("|") for line in table}) == 1  # header, rule and 3 rows, all of the same columns
    bad = subprocess.run([*cmd[:-2], f"timing={tmp_path}/nope.json", f"out={tmp_path}/other"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "timing" in bad.stderr and not (tmp_path / "other").exists()
    # a timing report of other sampler settings than the runs trained with is refused, nothing written
    (run / "config.yaml").write_text("seed: 1\nsampler: {num_steps: 10}\n")
    other = subprocess.run([*cmd[:-1], f"out={tmp_path}/other"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and "num_steps" in other.stderr and not (tmp_path / "other").exists()


def test_timing_matches_a_config_that_lacks_a_key_only_where_the_other_holds_its_default(tmp_path, monkeypatch):
    module = load_script("strategy_choice", monkeypatch)
    report = tmp_path / "timing.json"

    def timed(**sampler):
        report.write_text(json.dumps({"setting": {"sampler": {"num_steps": 10, **sampler}, "grpo": {}, "data": {}},
                                      "rows": [{"experiment": "full", "gradient_s": 4.0, "backward_items": 12}]}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("sampler:\n  num_steps: 10\n")  # written before tail_solver existed
    files = {"full": [str(run / "eval.json")]}
    timed(tail_solver=None)
    assert module._timing(str(report), files, "full") == {"full": (4.0 / 12, 4.0, 0.0)}  # nothing outside the gradient phase
    timed(tail_solver="euler")
    with pytest.raises(ValueError, match=r"sampler settings .*\['tail_solver'\]"):
        module._timing(str(report), files, "full")
    # the other way round: a timing written before group_noise existed, a run that trained with it at its
    # constructor's default (false) or not
    timed(_target_="jagg_lab.sampling.SDESampler")
    (run / "config.yaml").write_text("sampler:\n  _target_: jagg_lab.sampling.SDESampler\n  num_steps: 10\n  group_noise: false\n")
    assert module._timing(str(report), files, "full") == {"full": (4.0 / 12, 4.0, 0.0)}  # nothing outside the gradient phase
    (run / "config.yaml").write_text("sampler:\n  _target_: jagg_lab.sampling.SDESampler\n  num_steps: 10\n  group_noise: true\n")
    with pytest.raises(ValueError, match=r"sampler settings .*\['group_noise'\]"):
        module._timing(str(report), files, "full")


def test_the_paired_test_averages_each_arm_over_its_seeds_sample_by_sample(tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(evaluation([0] * 6, [0.5] * 6, "shipped")))
    full = [[0.6, 0.6, 0.6, 0.6, 0.6, 0.6], [0.8, 0.8, 0.8, 0.8, 0.8, 0.8]]
    other = [[0.7, 0.6, 0.9, 0.7, 0.6, 0.9]]
    for arm, seeds in (("full", full), ("other", other)):
        for seed, dense in enumerate(seeds):
            (tmp_path / f"{arm}_seed{seed}.json").write_text(json.dumps(evaluation([0] * 6, dense, arm)))
    out = tmp_path / "choice"
    proc = subprocess.run([sys.executable, "experiments/strategy_choice.py", f"base={base}",
                           f"finals=[full={tmp_path}/full_seed*.json,other={tmp_path}/other_seed*.json]", f"out={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (paired,) = json.loads((out / "choice.json").read_text())["paired"]
    diffs = [d - 0.7 for d in other[0]]  # full's seeds average 0.7 on every sample
    assert paired["dense_gain"] == pytest.approx(statistics.fmean(diffs))
    assert paired["dense_gain_se"] == pytest.approx(statistics.stdev(diffs) / 6 ** 0.5)


def test_the_step_clock_charges_whole_steps_from_a_bench_step_report(tmp_path):
    """clock=step: seconds per step are the rollout and reward plus the runs' backward items at the
    timed seconds per item, from each experiment's SDE (or own) row of a `bench step` report; a
    `bench arms` report, or one of several precisions, is refused naming timing."""
    base = tmp_path / "base.json"
    base.write_text(json.dumps(evaluation([0] * 6, [0.5] * 6, "shipped")))
    for arm in ("full", "awm"):
        (tmp_path / f"{arm}_seed0").mkdir()
        (tmp_path / f"{arm}_seed0" / "eval.json").write_text(json.dumps(evaluation([1, 0, 0, 0, 0, 0], [0.6] * 6, arm)))
    curve = tmp_path / "gain.json"
    points = [("full", 10, 0.10), ("full", 20, 0.20), ("awm", 10, 0.30), ("awm", 20, 0.50)]
    curve.write_text(json.dumps({"args": {"n_eval": 512, "curve_n_eval": 0}, "runs": [],
                                 "checkpoints": [{"arm": a, "seed": 0, "steps": n, "strict_gain": g, "dense_gain": g} for a, n, g in points]}))

    def row(experiment, rollout, gradient_s, items, rollout_s, precision="32-true"):
        return {"experiment": experiment, "rollout": rollout, "precision": precision, "compile": False, "rollout_s": rollout_s,
                "reward_s": 0.0, "gradient_s": gradient_s, "step_s": rollout_s + gradient_s, "backward_items": items}
    # full: 2 s of rollout and 2 s for 12 items; its euler:1 row is another rollout setting, not full's training step
    rows = [row("full", "sde", 2.0, 12, 2.0), row("full", "euler:1", 2.0, 12, 1.0), row("awm", "own", 4.0, 12, 2.0)]
    step = tmp_path / "step.json"
    step.write_text(json.dumps({"setting": {"grpo": {"sde_window": None}}, "rows": rows}))
    out = tmp_path / "choice"
    cmd = [sys.executable, "experiments/strategy_choice.py", f"base={base}",
           f"finals=[full={tmp_path}/full_seed*/eval.json,awm={tmp_path}/awm_seed*/eval.json]",
           f"gains=[{curve}]", "items=[full=12,awm=12]", f"curve_base={base}", f"timing={step}", "clock=step", f"out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "choice.json").read_text())
    arms = {a["arm"]: a for a in result["arms"]}
    assert arms["full"]["step_s_per_step"] == pytest.approx(4.0) and arms["awm"]["time_vs_reference"] == pytest.approx(1.5)
    (awm,) = result["equal_time"]  # awm's 20 steps take 120 s, full's 80: awm's curve at 80 s (step 13.3) against full's end
    assert awm["at"] == "full" and awm["steps"] == pytest.approx(40 / 3) and awm["step_s"] == pytest.approx(80)
    assert awm["strict_gain_mean"] == pytest.approx(0.30 + 0.20 / 3) and awm["reference_strict_gain_mean"] == pytest.approx(0.20)
    assert "Equal whole-step time" in (out / "choice.md").read_text()
    arms_report = tmp_path / "arms.json"
    arms_report.write_text(json.dumps({"setting": {}, "rows": [{"experiment": "full", "gradient_s": 1.0, "backward_items": 6}]}))
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"setting": {}, "rows": [*rows, row("full", "sde", 1.0, 12, 1.0, "bf16-mixed")]}))
    for report, clock, why in ((arms_report, "step", "bench arms"), (step, "gradient", "bench step"), (two, "step", "precisions")):
        bad = subprocess.run([*cmd[:-3], f"timing={report}", f"clock={clock}", f"out={tmp_path}/other"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "timing" in bad.stderr and why in bad.stderr and not (tmp_path / "other").exists()


def test_a_category_restricts_every_comparison_to_its_samples(tmp_path):
    """category=: the verdict set's samples of that category only (prompts cycle through the six
    categories: samples 2 and 8 of 12 are counting's)."""
    args = {**ARGS, "n_samples": 12}
    base = {"args": {**args, "checkpoint": "shipped"}, "n_samples": 12, "strict_accuracy": 0.0, "dense_score": 0.0,
            "per_sample": {"strict": [0] * 12, "dense": [0.0] * 12}}
    (tmp_path / "base.json").write_text(json.dumps(base))
    for seed in (0, 1):
        strict = [0] * 12
        strict[2] = 1  # a counting sample right in both seeds, one other sample in seed 1
        strict[3] = seed
        (tmp_path / f"full_seed{seed}.json").write_text(json.dumps(
            {**base, "args": {**args, "checkpoint": "full"}, "strict_accuracy": sum(strict) / 12, "per_sample": {"strict": strict, "dense": [0.0] * 12}}))
    out = tmp_path / "choice"
    proc = subprocess.run([sys.executable, "experiments/strategy_choice.py", f"base={tmp_path / 'base.json'}", "category=counting",
                           f"finals=[full={tmp_path}/full_seed*.json]", f"out={out}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arm = json.loads((out / "choice.json").read_text())["arms"][0]
    assert arm["strict_gain_mean"] == pytest.approx(0.5) and arm["strict_gain_std"] == 0  # 1 of 2 counting samples, both seeds
    assert "its counting samples" in (out / "choice.md").read_text()


def test_timing_more_adds_arms_at_their_ratio_to_the_reference(tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(evaluation([0] * 6, [0.5] * 6, "shipped")))
    for arm in ("full", "cheap", "late"):
        (tmp_path / f"{arm}.json").write_text(json.dumps(evaluation([1, 0, 0, 0, 0, 0], [0.6] * 6, arm)))
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps({"setting": {}, "rows": [{"experiment": "full", "gradient_s": 4.0, "backward_items": 12},
                                                         {"experiment": "cheap", "gradient_s": 2.0, "backward_items": 6}]}))
    # a later report on a slower machine: full 8 s, cheap 3 s (ignored: the first report timed it), late 2 s
    second.write_text(json.dumps({"setting": {}, "rows": [{"experiment": "full", "gradient_s": 8.0, "backward_items": 12},
                                                          {"experiment": "cheap", "gradient_s": 3.0, "backward_items": 6},
                                                          {"experiment": "late", "gradient_s": 2.0, "backward_items": 4}]}))
    out = tmp_path / "choice"
    cmd = [sys.executable, "experiments/strategy_choice.py", f"base={base}",
           f"finals=[full={tmp_path}/full.json,cheap={tmp_path}/cheap.json,late={tmp_path}/late.json]",
           "items=[full=12,cheap=6,late=4]", f"timing={first}", f"timing_more=[{second}]", f"out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arms = {a["arm"]: a for a in json.loads((out / "choice.json").read_text())["arms"]}
    assert arms["cheap"]["time_vs_reference"] == pytest.approx(0.5)  # the first report's own ratio
    assert arms["late"]["time_vs_reference"] == pytest.approx(0.25) and arms["late"]["gradient_s_per_step"] == pytest.approx(1.0)
    assert arms["late"]["timed_in"] == str(second) and arms["cheap"]["timed_in"] == str(first)
    assert "Not in the timing report" not in (out / "choice.md").read_text()
    assert f"Timed in {second}, beside full" in (out / "choice.md").read_text()
    alone = subprocess.run([*cmd[:4], f"timing_more=[{second}]", f"out={tmp_path}/other"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert alone.returncode != 0 and "timing_more" in alone.stderr and not (tmp_path / "other").exists()
    # a report that did not time the reference, or timed another setting, is refused naming timing_more
    unreferenced, elsewhere = tmp_path / "unreferenced.json", tmp_path / "elsewhere.json"
    unreferenced.write_text(json.dumps({"setting": {}, "rows": [{"experiment": "late", "gradient_s": 2.0, "backward_items": 4}]}))
    elsewhere.write_text(json.dumps({"setting": {"sampler": {"num_steps": 20}},
                                     "rows": [{"experiment": "full", "gradient_s": 8.0, "backward_items": 12}]}))
    for report, why in ((unreferenced, "did not time the reference"), (elsewhere, "sampler.num_steps")):
        bad = subprocess.run([*cmd[:-2], f"timing_more=[{report}]", f"out={tmp_path}/other"], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "timing_more" in bad.stderr and why in bad.stderr and not (tmp_path / "other").exists()
    # one rule with timing's check of runs: a key one report lacks counts as its constructor's default
    grpo = {"_target_": "jagg_lab.grpo.GRPOConfig", "clip_range": 1e-4}
    first.write_text(json.dumps({**json.loads(first.read_text()), "setting": {"grpo": {**grpo, "sde_window_schedule": "random"}}}))
    second.write_text(json.dumps({**json.loads(second.read_text()), "setting": {"grpo": grpo}}))
    same = subprocess.run([*cmd[:-1], f"out={tmp_path}/defaulted"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr[-3000:]
    second.write_text(json.dumps({**json.loads(second.read_text()), "setting": {"grpo": {**grpo, "sde_window_schedule": "sliding"}}}))
    bad = subprocess.run([*cmd[:-1], f"out={tmp_path}/other"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "grpo.sde_window_schedule" in bad.stderr and not (tmp_path / "other").exists()
