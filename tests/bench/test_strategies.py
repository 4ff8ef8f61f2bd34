"""`python -m jagg_lab.bench strategies`: every configuration's row on a tiny setting."""
import json

import pytest

from jagg_lab.bench.__main__ import main


def test_bench_strategies_reports_every_configuration(tmp_path):
    out = tmp_path / "bench.json"
    code = main(["strategies", "checkpoint=null", "size=XS", "prompts=2", "group_size=2", "num_steps=8",
                 "windows=[2,4]", "modes=[cached]", "knot_spacings=[3]", "knot_budgets=[3]", "repeats=1", f"out={out}"])
    assert code == 0
    rows = json.loads(out.read_text())["results"]
    keyed = {(r["strategy"], r["window"], r["mode"]): r for r in rows}
    assert set(keyed) == {("full", 1, "-"), ("subsample", 2, "-"), ("subsample", 4, "-"), ("jagg", 2, "cached"), ("jagg", 4, "cached"),
                          ("jagg_knots", 3, "cached"), ("jagg_knots_adaptive", 3, "cached"), ("jagg_knots_even", 3, "cached")}
    assert keyed[("jagg_knots", 3, "cached")]["backward_items"] == 4  # knots 0, 3, 6, 7
    assert keyed[("jagg", 2, "cached")]["grad_cosine"] > 0.9999
    assert keyed[("jagg", 4, "cached")]["backward_passes"] == 2 and keyed[("full", 1, "-")]["backward_passes"] == 8


@pytest.mark.slow
def test_bench_strategies_runs_sd3_random_policy(tmp_path):
    out = tmp_path / "sd3.json"
    code = main(["strategies", "policy=sd3_random", "dtype=float32", "num_layers=1", "resolution=64", "prompts=1",
                 "group_size=2", "num_steps=4", "windows=[2]", "modes=[cached]", "knot_spacings=[]", "knot_budgets=[]",
                 "repeats=1", f"out={out}"])
    assert code == 0
    rows = {(r["strategy"], r["window"]): r for r in json.loads(out.read_text())["results"]}
    assert rows[("jagg", 2)]["grad_cosine"] > 0.9999
