"""The configs in conf/ at the top of the checkout, found by both installs: the editable one (this
checkout) and a wheel, which carries them as jagg_lab/conf with the shipped policy and trains from
an install outside the checkout."""
import csv
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_editable_install_reads_the_checkouts_conf_from_anywhere(tmp_path):
    assert not (REPO / "jagg_lab" / "conf").exists()  # one copy of the configs: conf/
    found = run([sys.executable, "-c", "import jagg_lab; print(jagg_lab.__file__); print(jagg_lab.CONF_DIR)"], cwd=tmp_path)
    package, conf_dir = found.stdout.split()
    assert Path(package) == REPO / "jagg_lab" / "__init__.py" and Path(conf_dir) == REPO / "conf"
    # Hydra composes the training config from there: a group option and an experiment.
    job = run([sys.executable, "-m", "jagg_lab.train", "--cfg", "job", "policy=dit_xs", "+experiment=jagg_w4"], cwd=tmp_path)
    assert "size: XS" in job.stdout and "JaggStrategy" in job.stdout
    assert not any(tmp_path.iterdir())


def test_wheel_ships_the_configs_and_trains_outside_the_checkout(tmp_path):
    # Built from a copy, so the build leaves nothing (build/, egg-info) in the checkout.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(tmp_path / "dist")])
    (wheel,) = (tmp_path / "dist").glob("jagg_lab-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"jagg_lab/{p.relative_to(REPO).as_posix()}" for p in (REPO / "conf").rglob("*.yaml")}
    assert "jagg_lab/conf/hydra/launcher/slurm.yaml" in configs and configs <= shipped
    assert "jagg_lab/assets/shapes_dit_s.safetensors" in shipped
    assert "hydra_plugins/jagg_lab_launcher/__init__.py" in shipped  # hydra/launcher=local's launcher

    site, elsewhere, run_dir = tmp_path / "site", tmp_path / "elsewhere", tmp_path / "run"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)])
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    imported = run([sys.executable, "-c", "import jagg_lab; print(jagg_lab.__file__)"], cwd=elsewhere, env=env)
    assert Path(imported.stdout.strip()) == site / "jagg_lab" / "__init__.py"  # the wheel's copy, not the checkout
    # The default experiment with the shipped policy; 4 prompts instead of 8 halve the CPU time of the step.
    run([sys.executable, "-m", "jagg_lab.train", "+experiment=full", "trainer.max_steps=1", "data.prompts_per_step=4",
         f"hydra.run.dir={run_dir}"], cwd=elsewhere, env=env)
    with open(run_dir / "metrics.csv") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == [1]
    assert (run_dir / "policy.safetensors").is_file() and (run_dir / "config.yaml").is_file()
    assert not any(elsewhere.iterdir())  # the run wrote only into hydra.run.dir
