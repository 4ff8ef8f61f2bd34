"""experiments/render_tables.py: the committed README and docs tables are what the committed
result files render to, and an edited number or a new measurement makes the check fail."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("render_tables", REPO / "experiments" / "render_tables.py")
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)


def test_committed_tables_are_current():
    diffs = rt.stale(rt.markdown_files())
    assert not diffs, "stale tables; run python experiments/render_tables.py\n" + "".join(diffs)


def _table(text: str, name: str) -> list[str]:
    return text.split(f"<!-- table:{name} -->\n", 1)[1].split("<!-- /table -->", 1)[0].strip().splitlines()


def test_readme_holds_the_strategy_table_with_numbers_in_its_cells_and_evidence_in_its_headers():
    text = (REPO / "README.md").read_text()
    table = _table(text, "strategies")
    rows = table[2:]
    assert [r.split("|")[1].strip().strip("*`") for r in rows] == rt.README_ARMS
    assert not any("](" in row for row in rows)  # cells free of links
    assert "[backward items / step (x `full`)](docs/results/training.md#" in table[0]
    subsample = next(r for r in rows if "subsample_w6" in r)
    choice = {a["arm"]: a for a in json.loads((REPO / rt.CHOICE).read_text())["arms"]}["subsample_w6"]
    assert f"{choice['strict_gain_mean']:+.3f} +- {choice['strict_gain_std']:.3f}" in subsample
    assert "| 6 (0.50) |" in subsample
    # the grading with power: each arm on the verdict set's counting samples, with its paired z against full
    counting = json.loads((REPO / rt.COUNTING).read_text())
    arm = {a["arm"]: a for a in counting["arms"]}["subsample_w6"]
    paired = {p["arm"]: p for p in counting["paired"]}["subsample_w6"]
    assert f"{arm['strict_gain_mean']:+.3f} +- {arm['strict_gain_std']:.3f}" in subsample
    assert f"| {paired['strict_gain'] / paired['strict_gain_se']:+.1f} |" in subsample
    assert "[strict gain on counting (seeds)](docs/results/learning.md#" in table[0]


def test_readme_holds_the_objectives_table_and_the_figure_of_what_the_result_files_say():
    text = (REPO / "README.md").read_text()
    table = _table(text, "readme_objectives")
    rows = {r.split("|")[1].strip().strip("*`"): r for r in table[2:]}
    assert list(rows) == ["full", "subsample_w6", "awm", "nft", "flow_grpo_fast", "mixgrpo"]
    assert not any("](" in row for row in rows.values())
    result = json.loads((REPO / rt.OBJECTIVES / "all" / "choice.json").read_text())
    awm = {a["arm"]: a for a in result["arms"]}["awm"]
    assert f"{awm['step_s_per_step']:.2f} ({awm['time_vs_reference']:.2f})" in rows["awm"]
    assert f"{awm['strict_gain_mean']:+.3f} +- {awm['strict_gain_std']:.3f}" in rows["awm"]
    assert "](docs/figures/gain_vs_step_time.png)" in text
    data = json.loads((REPO / f"{rt.FIGURE}.json").read_text())
    drawn = {a["arm"]: a for a in data["arms"]}
    assert {"full", "subsample_w6", "jagg_w4", "awm", "nft"} <= set(drawn)
    counting = {a["arm"]: a for a in json.loads((REPO / rt.COUNTING).read_text())["arms"]}
    assert drawn["jagg_w4"]["strict_gains"] == [round(r["strict_gain"], 6) for r in counting["jagg_w4"]["runs"]]


def test_the_figure_check_fails_when_its_data_are_edited(tmp_path):
    (tmp_path / rt.FIGURE).parent.mkdir(parents=True)
    (tmp_path / f"{rt.FIGURE}.png").write_bytes((REPO / f"{rt.FIGURE}.png").read_bytes())
    data = rt.figure_data()
    (tmp_path / f"{rt.FIGURE}.json").write_text(json.dumps(data, indent=1) + "\n")
    assert rt.stale_figure(tmp_path) == []
    data["arms"][0]["strict_gain_mean"] += 0.01
    (tmp_path / f"{rt.FIGURE}.json").write_text(json.dumps(data, indent=1) + "\n")
    assert len(rt.stale_figure(tmp_path)) == 1


def test_the_objectives_document_holds_the_objectives_table_on_the_whole_step_clock():
    """The recommendation's evidence: AWM beside `full`, `subsample_w6` and the peers' step
    schedules, each number from experiments/results/objectives/ (strategy_choice on the
    whole-step clock)."""
    text = (REPO / "docs" / "objectives.md").read_text()
    table = text.split("<!-- table:objectives -->\n", 1)[1].split("<!-- /table -->", 1)[0]
    rows = {r.split("|")[1].strip().strip("`"): r for r in table.strip().splitlines()[2:]}
    assert list(rows) == ["full", "subsample_w6", "awm", "nft", "flow_grpo_fast", "mixgrpo"]
    result = json.loads((REPO / rt.OBJECTIVES / "all" / "choice.json").read_text())
    assert result["args"]["clock"] == "step"
    awm = {a["arm"]: a for a in result["arms"]}["awm"]
    paired = {p["arm"]: p for p in result["paired"]}["awm"]
    at_time = {r["arm"]: r for r in result["equal_time"]}["awm"]
    assert f"{awm['step_s_per_step']:.2f} ({awm['time_vs_reference']:.2f})" in rows["awm"]
    assert f"{awm['strict_gain_mean']:+.3f} +- {awm['strict_gain_std']:.3f}" in rows["awm"]
    assert f"{paired['strict_gain'] / paired['strict_gain_se']:+.1f}" in rows["awm"]
    assert f"{at_time['strict_gain_mean']:+.3f} vs {at_time['reference_strict_gain_mean']:+.3f}" in rows["awm"]


@pytest.mark.parametrize("where", ["README.md", "docs/results/training.md"])
def test_check_fails_when_a_committed_number_is_edited(tmp_path, where):
    copy = tmp_path / where
    copy.parent.mkdir(parents=True, exist_ok=True)
    text = (REPO / where).read_text()
    assert "+0.022 +- 0.022" in text  # subsample_w6's strict gain, in a rendered table
    shutil.copy(REPO / where, copy)
    assert rt.stale([copy], root=tmp_path) == []
    copy.write_text(text.replace("+0.022 +- 0.022", "+0.025 +- 0.022", 1))
    diffs = rt.stale([copy], root=tmp_path)
    assert len(diffs) == 1
    removed = [l for l in diffs[0].splitlines() if l.startswith("-") and not l.startswith("---")]
    added = [l for l in diffs[0].splitlines() if l.startswith("+") and not l.startswith("+++")]
    assert len(removed) == len(added) == 1 and "+0.025 +- 0.022" in removed[0] and "+0.022 +- 0.022" in added[0]


def test_check_command_exits_0_on_the_repository_and_names_an_unknown_table(tmp_path):
    done = subprocess.run([sys.executable, "experiments/render_tables.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- table:nonesuch -->\n<!-- /table -->\n")
    with pytest.raises(KeyError, match="nonesuch"):
        rt.stale([doc], root=tmp_path)


def test_a_step_report_timing_full_fills_the_whole_step_column(tmp_path, monkeypatch):
    """A `bench step` report that times `full` beside the other arms on the default task fills the
    column from its float32 rows (the committed one does); a smoke run of another model and the
    rows of another precision do not."""
    committed = rt.whole_step_ratios()
    assert committed["full"] == (1.0, f"{rt.STEP_DIR}/default_precisions.json") and 0 < committed["subsample_w6"][0] < 1
    step = tmp_path / rt.STEP_DIR
    step.mkdir(parents=True)
    rows = [{"experiment": e, "rollout": "sde", "step_s": s} for e, s in (("full", 10.0), ("subsample_w6", 7.5))]
    rows += [{"experiment": e, "rollout": "sde", "precision": "bf16-mixed", "step_s": 1.0} for e in ("full", "subsample_w6")]
    (step / "default.json").write_text(json.dumps({"setting": {"policy": {"checkpoint": "shipped"}}, "rows": rows}))
    (step / "smoke.json").write_text(json.dumps({"setting": {"policy": {"checkpoint": None}},
                                                 "rows": [{**r, "step_s": 1.0} for r in rows]}))
    monkeypatch.setattr(rt, "ROOT", tmp_path)
    ratios = rt.whole_step_ratios()
    assert ratios["subsample_w6"] == (0.75, f"{rt.STEP_DIR}/default.json")
    monkeypatch.setattr(rt, "ROOT", REPO)  # the choice files stay the repository's
    monkeypatch.setattr(rt, "whole_step_ratios", lambda: ratios)
    assert "| 0.75 |" in rt.strategies()
