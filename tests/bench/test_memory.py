"""Memory in the benchmarks: measured per configuration, bounded by max_pass_items, and a
configuration that does not fit is recorded as "oom" while the benchmark goes on. On CPU,
through SD3.5-Medium's transformer with one layer at a tiny resolution."""
import json

import pytest
import torch

from jagg_lab.bench import common
from jagg_lab.bench.__main__ import main
from jagg_lab.strategies import JaggStrategy

SD3_TINY = ["policy=sd3_random", "dtype=float32", "num_layers=1", "resolution=32", "prompts=1", "group_size=2",
            "num_steps=4", "windows=[4]", "modes=[cached]", "knot_spacings=[3]", "knot_budgets=[]", "repeats=1"]


def rows_of(path):
    return {(r["strategy"], r["window"], r["max_pass_items"]): r for r in json.loads(path.read_text())["results"]}


def test_joint_pass_memory_its_bound_and_the_oom_path(tmp_path):
    first = tmp_path / "free.json"
    assert main(["strategies", *SD3_TINY, "max_pass_items=[null,1]", f"out={first}"]) == 0
    rows = rows_of(first)
    full, joint, bounded = rows[("full", 1, None)], rows[("jagg", 4, None)], rows[("jagg", 4, 1)]
    assert all(r["status"] == "ok" and r["time_s"] > 0 and r["backward_items"] for r in rows.values())
    # JAGG's joint pass carries both endpoints at once; one item per pass needs what full needs
    assert joint["peak_memory_mib"] > 1.5 * full["peak_memory_mib"]
    assert bounded["peak_memory_mib"] == pytest.approx(full["peak_memory_mib"], rel=0.1)
    assert bounded["backward_passes"] == 2 and joint["backward_passes"] == 1
    assert bounded["grad_cosine"] == pytest.approx(joint["grad_cosine"], abs=1e-4)
    assert full["peak_allocated_mib"] is None  # not measured on CPU, never a made-up number

    # a limit between the two: the joint passes do not fit, the rest still runs
    limit_gib = (full["peak_memory_mib"] + joint["peak_memory_mib"]) / 2 / 1024
    second = tmp_path / "limited.json"
    assert main(["strategies", *SD3_TINY, "max_pass_items=[null,1]", f"memory_limit_gib={limit_gib}", f"out={second}"]) == 0
    rows = rows_of(second)
    assert rows[("jagg", 4, None)]["status"] == "oom" and rows[("jagg_knots", 3, None)]["status"] == "oom"
    assert rows[("jagg", 4, None)]["time_s"] is None and rows[("jagg", 4, None)]["grad_cosine"] is None
    assert all(rows[key]["status"] == "ok" and rows[key]["time_s"] > 0 for key in
               [("full", 1, None), ("subsample", 4, None), ("jagg", 4, 1), ("jagg_knots", 3, 1)])


def test_an_out_of_memory_error_in_a_phase_is_a_status_not_a_crash(monkeypatch):
    from tests.conftest import make_module, rollout_and_advantages

    module = make_module(num_steps=4)
    rollout, advantages = rollout_and_advantages(module)

    def raise_oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    strategy = JaggStrategy(window=4)
    monkeypatch.setattr(strategy, "backward", raise_oom)
    memory = common.measure_memory(lambda: common.gradient_phase(module, strategy, rollout, advantages, "cpu"), "cpu")
    assert memory.status == "oom" and memory.peak_mib is None
    ok = common.measure_memory(lambda: common.gradient_phase(module, JaggStrategy(window=4), rollout, advantages, "cpu"), "cpu")
    assert ok.status == "ok" and ok.peak_mib > 0


def test_micro_batches_split_the_phase_and_keep_the_gradient():
    from tests.conftest import flat_grad, make_module, rollout_and_advantages

    module = make_module(num_steps=4)
    rollout, advantages = rollout_and_advantages(module)
    _, one = common.gradient_phase(module, JaggStrategy(window=4), rollout, advantages, "cpu", micro_batches=1)
    whole = flat_grad(module)
    _, two = common.gradient_phase(module, JaggStrategy(window=4), rollout, advantages, "cpu", micro_batches=2)
    assert torch.allclose(flat_grad(module), whole, rtol=1e-4, atol=1e-7)
    assert two["backward_passes"] == 2 * one["backward_passes"]


def test_whole_step_timing_of_the_real_size_model(tmp_path):
    out = tmp_path / "speed"
    assert main(["speed", "policy=sd3_random", "num_layers=1", "resolutions=[32]", "prompts=1", "group_size=2",
                 "num_steps=4", "windows=[4]", "subsample_windows=[4]", "repeats=1", "warmup=0", f"out={out}"]) == 0
    rows = json.loads((out / "speed.json").read_text())["rows"]
    assert {r["strategy"] for r in rows} == {"full", "jagg", "subsample"}
    for r in rows:
        assert r["size"] == "sd3.5m" and r["rollout_s"] > 0 and r["gradient_s"] > 0
        assert r["step_s"] == pytest.approx(r["rollout_s"] + r["reward_s"] + r["gradient_s"], rel=1e-6)
