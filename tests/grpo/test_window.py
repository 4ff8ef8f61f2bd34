"""A moving SDE window (grpo.sde_window): which steps each rollout trains, how the rollout
samples around them, and that the gradient phase trains exactly those steps."""
import pytest
import torch

from jagg_lab.grpo import GRPOConfig
from jagg_lab.strategies import FullStrategy
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient


def test_random_windows_cover_their_range_and_sliding_windows_move_on_schedule():
    random = GRPOConfig(sde_window=2, sde_window_range=(0, 6))
    starts = {random.sde_window_steps(10, 0, torch.Generator().manual_seed(i))[0] for i in range(200)}
    assert starts == {0, 1, 2, 3, 4}  # windows [s, s + 1] inside [0, 6)
    sliding = GRPOConfig(sde_window=4, sde_window_schedule="sliding", sde_window_range=(0, 8), sde_window_shift_every=25)
    assert [sliding.sde_window_steps(10, r, None) for r in (0, 24, 25, 99, 125)] == [
        [0, 1, 2, 3], [0, 1, 2, 3], [1, 2, 3, 4], [3, 4, 5, 6], [0, 1, 2, 3]]  # 5 starts (0..4), then back


@pytest.mark.parametrize("bad, key", [
    (dict(sde_window=0), "grpo.sde_window"),
    (dict(sde_window=2, sde_window_schedule="cyclic"), "grpo.sde_window_schedule"),
    (dict(sde_window=2, sde_window_range=(4, 2)), "grpo.sde_window_range"),
    (dict(sde_window=2, train_steps=(0, 1)), "grpo.train_steps"),
])
def test_bad_window_settings_are_named(bad, key):
    with pytest.raises(ValueError, match=key):
        GRPOConfig(**bad)
    with pytest.raises(ValueError, match="grpo.sde_window_range"):
        GRPOConfig(sde_window=4, sde_window_range=(0, 3)).sde_window_steps(10, 0, None)


def test_a_windowed_rollout_is_sde_inside_the_window_ode_around_it_and_trains_only_it():
    module = make_module(num_steps=8, sde_window=2, sde_window_schedule="sliding", sde_window_range=(0, 8),
                         sde_window_shift_every=1, sde_window_stride=3)
    module.rollouts_done = 1  # start 3: steps 3 and 4
    rollout, adv = rollout_and_advantages(module)
    assert rollout.trained_steps == (3, 4)
    finite = torch.isfinite(rollout.log_probs).all(0)
    assert finite.tolist() == [k in (3, 4) for k in range(8)]
    assert [(p.first, p.end, p.solver) for p in rollout.ode_phases] == [(0, 3, "euler"), (5, 8, "euler")]
    got, stats = strategy_gradient(module, FullStrategy(), rollout, adv)
    assert stats["backward_items"] == 2
    # The same gradient from a fixed-step objective over steps 3 and 4 of the same rollout.
    module.objective.loss = type(module.objective.loss)(loss=module.objective.loss.loss, trained_steps=(3, 4), guidance=module.objective.loss.guidance)
    unwindowed = type(rollout)(**{**rollout.__dict__, "trained_steps": None})
    assert torch.allclose(got, strategy_gradient(module, FullStrategy(), unwindowed, adv)[0])
    module.objective.loss = type(module.objective.loss)(loss=module.objective.loss.loss, trained_steps=(2, 3), guidance=module.objective.loss.guidance)
    # step 2 was sampled by ODE: nothing recorded there (NaN), so the window must come from the rollout
    assert not torch.isfinite(strategy_gradient(module, FullStrategy(), unwindowed, adv)[0]).all()


def test_the_renamed_window_keys_are_refused_naming_the_new_key(hydra_cfg, tmp_path):
    """grpo.window_size & co. became grpo.sde_window*: on the command line (before Hydra), in a
    composed config (an experiment file written before the rename) and in a benchmark's overrides."""
    import subprocess
    import sys

    from jagg_lab.bench.common import training_config
    from jagg_lab.train import ConfigError, build

    cli = subprocess.run([sys.executable, "-m", "jagg_lab.train", "grpo.window_size=2", f"hydra.run.dir={tmp_path / 'cli'}"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and "grpo.window_size was renamed grpo.sde_window" in cli.stderr
    assert not (tmp_path / "cli").exists()
    with pytest.raises(ConfigError, match="grpo.window_range was renamed grpo.sde_window_range"):
        build(hydra_cfg(["+grpo.window_range=[0,4]", "policy=dit_xs"]), tmp_path / "composed")
    assert not (tmp_path / "composed").exists()
    with pytest.raises(ValueError, match="grpo.window_stride was renamed grpo.sde_window_stride"):
        training_config("flow_grpo_fast", 0, ["grpo.window_stride=2"])
