"""Sweeps, collation and the quality table on tiny settings (the KL to the base and the run
summaries behind them are tested in tests/evaluation/)."""
from __future__ import annotations

import csv
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate

from tests.conftest import CONF_DIR
from tests.test_train_cli import REPO, TINY

SWEEPS = ("sweep_windows", "sweep_routing", "sweep_routing_frac", "sweep_resolution")


def run_cmd(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def make_tiny_runs(tmp_path_factory) -> Path:
    """Two tiny Hydra multiruns, built once per test session (tests/test_notebook.py reuses them):
    ROOT/windows, the jagg_w4 window sweep (jobs 0 and 1), and ROOT/routing, sweep_routing with
    thresholds -1 (every window through JAGG) and 0.99 on 12 trained steps (3 windows)."""
    root = tmp_path_factory.getbasetemp() / "tiny_runs"
    if not (root / "done").is_file():
        run_cmd("-m", "jagg_lab.train", "--multirun", "+experiment=jagg_w4", "strategy.window=2,4", "trainer.max_steps=1",
                f"hydra.sweep.dir={root / 'windows'}", *TINY)
        run_cmd("-m", "jagg_lab.train", "--multirun", "+experiment=sweep_routing", "strategy.cos_threshold=-1.0,0.99", "seed=0",
                "trainer.max_steps=1", f"hydra.sweep.dir={root / 'routing'}", *TINY[:-1], "sampler.num_steps=12")
        (root / "done").touch()
    return root


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> Path:
    return make_tiny_runs(tmp_path_factory)


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


# ---- sweeps and launchers -----------------------------------------------------------

def test_tiny_multirun_writes_one_metrics_csv_per_job(tiny_runs):
    windows = tiny_runs / "windows"
    assert sorted(p.name for p in windows.iterdir() if p.is_dir()) == ["0", "1"]
    for job, window in (("0", 2), ("1", 4)):
        rows = read_csv(windows / job / "metrics.csv")
        assert len(rows) == 1 and "reward_mean" in rows[0]
        assert f"window: {window}" in (windows / job / "config.yaml").read_text()
    routed = [read_csv(tiny_runs / "routing" / job / "metrics.csv")[0] for job in ("0", "1")]
    assert float(routed[0]["jagg_frac"]) == 1.0  # cos_threshold -1: every window through JAGG
    assert {"jagg_frac_high", "jagg_frac_low", "route_score_mid"} <= set(routed[1])


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_job_of_every_sweep_composes_and_builds(sweep):
    """Expand hydra.sweeper.params as the sweeper does; each job's strategy and policy build."""
    params = compose_train([f"+experiment={sweep}"]).hydra.sweeper.params
    assert params and "seed" in params
    parser = OverridesParser.create()
    axes = [[f"{key}={value}" for value in parser.parse_overrides([f"{key}={values}"])[0].sweep_string_iterator()]
            for key, values in params.items()]
    jobs = list(itertools.product(*axes))
    assert len(jobs) >= 9
    for job in jobs:
        if "seed=0" not in job:
            continue  # seeds change nothing that is built
        cfg = compose_train([f"+experiment={sweep}", *job])
        instantiate(cfg.strategy)
        if sweep == "sweep_resolution":
            assert cfg.policy.checkpoint is None  # the shipped base is 32 px only
            policy = instantiate(cfg.policy, size="XS")
            resolution = cfg.policy.resolution
            x = torch.zeros(1, 3, resolution, resolution)
            assert policy(x, torch.ones(1), policy.encode_prompts(["a red circle"])).shape == x.shape


def test_launchers_compose():
    local = compose_train(["hydra/launcher=local"]).hydra.launcher
    from hydra.utils import get_class

    # jagg_lab's local launcher: Hydra's joblib launcher whose sweep stops cleanly on Ctrl-C (jagg_lab.sweeps)
    assert local._target_ == "hydra_plugins.jagg_lab_launcher.LocalLauncher" and local.n_jobs >= 1
    assert "JoblibLauncher" in [c.__name__ for c in get_class(local._target_).__mro__]
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    slurm = compose_train(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"]).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and slurm.partition == "gpu"
    assert {"timeout_min", "gpus_per_node", "cpus_per_task", "mem_gb"} <= set(slurm)


# ---- collation ----------------------------------------------------------------------

def test_collate_turns_a_sweep_into_tables_and_plots(tiny_runs, tmp_path):
    out = tmp_path / "windows"
    run_cmd("experiments/collate.py", f"runs={tiny_runs / 'windows'}", f"out={out}")
    rows = {r["run"]: r for r in read_csv(out / "runs.csv")}
    assert set(rows) == {"0", "1"}
    assert {"label", "strategy.window", "steps", "reward_final", "time_per_step_s", "time_gradient_s", "backward_passes"} <= set(rows["0"])
    assert "seed" not in rows["0"]  # only keys that differ between runs are columns
    assert (rows["0"]["label"], rows["1"]["label"]) == ("window=2", "window=4")
    # 3 trained steps x 2 micro-batches: windows [0, 1], [2] -> 4 backward passes; one window of 3 -> 2
    assert (float(rows["0"]["backward_passes"]), float(rows["1"]["backward_passes"])) == (4.0, 2.0)
    groups = read_csv(out / "groups.csv")
    assert [g["label"] for g in groups] == ["window=2", "window=4"] and {"reward_final_mean", "reward_final_std"} <= set(groups[0])
    assert "| run | label | strategy.window |" in (out / "runs.md").read_text()
    assert all((out / name).stat().st_size > 0 for name in ("reward_vs_step.png", "reward_vs_time.png", "time_breakdown.png"))
    assert not (out / "routing.png").exists()

    both = tmp_path / "both"
    run_cmd("experiments/collate.py", f"runs={tiny_runs}", f"out={both}")
    table = pd.read_csv(both / "runs.csv")
    assert len(table) == 4 and {"strategy._target_", "strategy.cos_threshold", "jagg_frac_high"} <= set(table.columns)
    assert (both / "routing.png").is_file()

    proc = run_cmd("experiments/collate.py", f"runs={tiny_runs}", f"out={both}", check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr


# ---- the quality table --------------------------------------------------------------

def test_quality_table_on_a_tiny_setting(tmp_path):
    out = tmp_path / "quality"
    overrides = "[" + ",".join([*TINY, "reward=jpeg", "optimizer.lr=1e-3"]) + "]"
    args = ["experiments/quality.py", "experiments=[full,jagg_w4]", "seeds=[0,1]", "steps=1", "n_eval=4", "n_kl=2",
            "eval_steps=2", "diagnose_every=2", f"overrides={overrides}", f"out={out}"]
    run_cmd(*args)
    table = pd.read_csv(out / "quality.csv").set_index("experiment")
    assert table.index.tolist() == ["base", "full", "jagg_w4"]
    assert table.loc["jagg_w4", "n_seeds"] == 2
    for name in ("strict_accuracy", "dense_score", "strict_counting", "dense_counting", "fid", "kid", "kl_to_base",
                 "reward_final", "reward_at_equal_time", "time_per_step_s", "backward_passes"):
        for experiment in ("full", "jagg_w4"):
            assert math.isfinite(table.loc[experiment, f"{name}_mean"]), (experiment, name)
            assert math.isfinite(table.loc[experiment, f"{name}_std"]), (experiment, name)
    assert table.loc["base", "kl_to_base_mean"] == 0 and table.loc["full", "kl_to_base_mean"] > 0
    # the recipe's category, scored on its own samples (the 3rd of n_eval=4 prompts is counting's)
    base_eval = json.loads((out / "base_eval.json").read_text())
    assert table.loc["base", "strict_counting_mean"] == base_eval["per_category"]["counting"]["strict_accuracy"]
    seed0 = json.loads((out / "runs" / "full" / "seed0" / "eval.json").read_text())
    assert seed0["dense_counting"] == seed0["per_category"]["counting"]["dense_score"] == seed0["per_sample"]["dense"][2]
    assert -1 <= table.loc["jagg_w4", "grad_cosine_mean"] <= 1 and math.isnan(table.loc["full", "grad_cosine_mean"])
    assert table.loc["full", "backward_passes_mean"] == 6 and table.loc["jagg_w4", "backward_passes_mean"] == 2
    assert " ± " in (out / "quality.md").read_text()
    report = json.loads((out / "quality.json").read_text())
    assert report["equal_time_s"] > 0 and len(report["runs"]) == 4 and report["args"]["steps"] == 1
    for experiment in ("full", "jagg_w4"):
        for seed in (0, 1):
            assert "kl_to_base" in json.loads((out / "runs" / experiment / f"seed{seed}" / "eval.json").read_text())
    assert (out / "reward_vs_step.png").is_file() and (out / "reward_vs_time.png").is_file()

    before = (out / "quality.csv").read_text()
    proc = run_cmd(*args, check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert (out / "quality.csv").read_text() == before


@pytest.mark.parametrize("argv, key", [(["n_eval=8", "n_kl=9"], "n_kl"), (["category=counts"], "category"),
                                       (["n_eval=2", "n_kl=1"], "category=counting")])
def test_quality_rejects_bad_arguments_before_writing(tmp_path, argv, key):
    proc = run_cmd("experiments/quality.py", *argv, f"out={tmp_path / 'q'}", check=False)
    assert proc.returncode == 2 and key in proc.stderr and not (tmp_path / "q").exists()
