"""Rollouts whose untrained head or tail is sampled by a deterministic ODE (sampler.tail_solver / head_solver)."""
import math

import pytest
import torch

from jagg_lab.grpo import GRPOConfig
from jagg_lab.sampling import SDESampler, noise_schedule, sde_rollout
from jagg_lab.sampling.rollout import ode_integrate, ode_sample, phase_levels
from jagg_lab.sampling.sde import sde_mean, sde_std
from jagg_lab.strategies import FullStrategy
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient


def exponential(x, s):
    """dx/ds = x: x(s) = x(s0) exp(s - s0), smooth, so a solver's order shows."""
    return x


@pytest.mark.parametrize("solver, order", [("euler", 1), ("heun", 2), ("ab2", 2)])
def test_solvers_converge_at_their_order(solver, order):
    x0 = torch.ones(1, 1)
    exact = math.exp(0.2 - 1.0)
    errors = []
    for n in (8, 16, 32):
        levels = torch.linspace(1.0, 0.2, n + 1).tolist()
        x, calls = ode_integrate(exponential, x0, levels, solver)
        errors.append(abs(x.item() - exact))
        assert calls == (2 * n if solver == "heun" else n)
    rates = [math.log2(errors[i] / errors[i + 1]) for i in range(2)]
    assert all(abs(rate - order) < 0.25 for rate in rates), rates


def test_heun_ends_with_an_euler_step_at_zero_and_euler_is_the_evaluation_sampler():
    levels = [1.0, 0.5, 0.0]
    _, calls = ode_integrate(exponential, torch.ones(2, 1), levels, "heun")
    assert calls == 3  # a corrector at s = 0 would need the velocity there
    x = torch.randn(3, 2)
    torch.testing.assert_close(ode_sample(exponential, x, torch.tensor(levels)), x * 0.5 * 0.5)
    with pytest.raises(ValueError, match="solver"):
        ode_integrate(exponential, x, levels, "rk4")


def test_phase_levels_follow_the_grid():
    grid = noise_schedule(10, shift=3.0).tolist()
    assert phase_levels(grid, 6, 10, None) == pytest.approx(grid[6:])
    assert phase_levels(grid, 6, 10, 2) == pytest.approx([grid[6], grid[8], grid[10]])
    three = phase_levels(grid, 6, 10, 3)
    assert three[0] == grid[6] and three[-1] == 0.0 and all(a > b for a, b in zip(three, three[1:]))
    with pytest.raises(ValueError, match="at least one step"):
        phase_levels(grid, 6, 10, 0)


@pytest.fixture(scope="module")
def module():
    return make_module(guidance=3.0, num_steps=8, train_fraction=0.5, shift=1.0)


def rollout(module, seed=0, **phases):
    prompts = ["a red circle"] * 4
    with torch.inference_mode():
        cond, null = module.policy.encode_prompts(prompts), module.policy.encode_prompts([""])
    from jagg_lab.policies import guided_velocity_fn

    noise = torch.randn((4, *module.policy.sample_shape), generator=torch.Generator().manual_seed(seed))
    return sde_rollout(guided_velocity_fn(module.policy, cond, null, 3.0), noise, module.sampler.noise_levels(),
                       noise_level=0.7, cond=cond, null_cond=null, generator=torch.Generator().manual_seed(seed + 1), **phases)


@pytest.mark.parametrize("solver, steps, calls", [("euler", 1, 1), ("euler", None, 4), ("heun", 2, 3), ("ab2", 2, 2)])
def test_ode_tail_keeps_the_trained_transitions_and_records_itself(module, solver, steps, calls):
    sde = rollout(module)
    fast = rollout(module, sde_span=(0, 3), tail=(solver, steps))
    for name in ("states", "next_states", "velocities", "log_probs"):
        torch.testing.assert_close(getattr(fast, name)[:, :4], getattr(sde, name)[:, :4], rtol=0, atol=0)
        assert getattr(fast, name)[:, 4:].isnan().all()  # nothing recorded where the ODE sampled
    (phase,) = fast.ode_phases
    assert (phase.first, phase.end, phase.solver, phase.forwards) == (4, 8, solver, calls)
    assert fast.forwards == 4 + calls and sde.forwards == 8 and sde.ode_phases == ()
    assert not fast.final.isnan().any() and (fast.final - sde.final).abs().max() > 1e-3


def test_ode_head_keeps_the_noise_of_the_sde_steps(module):
    sde = rollout(module)
    fast = rollout(module, sde_span=(2, 7), head=("euler", 1))
    assert fast.states[:, :2].isnan().all() and fast.forwards == 1 + 6
    levels = module.sampler.noise_levels().tolist()
    for k in range(2, 8):  # the same noise drawn at every SDE step, on other states
        std_k, std = sde_std(levels[k], levels[k + 1], 0.7, levels[1])
        drawn = [(r.next_states[:, k] - sde_mean(r.states[:, k], r.velocities[:, k], levels[k], levels[k + 1], std_k)) / std
                 for r in (sde, fast)]
        torch.testing.assert_close(drawn[0], drawn[1], rtol=1e-4, atol=1e-4)


def test_module_trains_the_same_steps_with_an_ode_tail():
    """Same advantages, same trained transitions: the gradient of a run with an ODE tail is the SDE run's."""
    base = make_module(guidance=3.0, num_steps=8, train_fraction=0.5)
    tailed = make_module(guidance=3.0, num_steps=8, train_fraction=0.5)
    tailed.sampler = SDESampler(num_steps=8, shift=3.0, guidance=3.0, tail_solver="euler", tail_steps=1)
    sde, advantages = rollout_and_advantages(base)
    fast, _ = rollout_and_advantages(tailed)
    assert fast.forwards == 5 and sde.forwards == 8
    f_sde, _ = strategy_gradient(base, FullStrategy(), sde, advantages)
    f_fast, _ = strategy_gradient(tailed, FullStrategy(), fast, advantages)
    torch.testing.assert_close(f_fast, f_sde)


def test_bad_phase_settings_name_the_key():
    with pytest.raises(ValueError, match="sampler.tail_solver"):
        SDESampler(tail_solver="rk4")
    with pytest.raises(ValueError, match="sampler.head_steps"):
        SDESampler(head_steps=2)  # steps without a solver
    with pytest.raises(ValueError, match="sampler.tail_steps"):
        SDESampler(tail_solver="euler", tail_steps=0)
    trained = GRPOConfig(train_fraction=1.0).trained_steps(10)
    with pytest.raises(ValueError, match="sampler.tail_solver.*no tail"):
        SDESampler(tail_solver="euler").ode_phases(trained)
    with pytest.raises(ValueError, match="sampler.head_solver.*no head"):
        SDESampler(head_solver="euler").ode_phases(trained)
    assert SDESampler().ode_phases(trained) == {}
    assert SDESampler(tail_solver="ab2", tail_steps=2).ode_phases([0, 1, 2]) == {
        "sde_span": (0, 2), "head": None, "tail": ("ab2", 2)}


@pytest.mark.slow
def test_a_compiled_rollout_samples_what_the_eager_one_does():
    module = make_module(guidance=3.0, num_steps=4, train_fraction=0.5)
    eager, _ = rollout_and_advantages(module)
    module.compile_rollout(True)
    compiled, _ = rollout_and_advantages(module)
    assert "compiled_forward" not in dict(module.named_modules())  # one copy of the weights in the state dict
    torch.testing.assert_close(compiled.final, eager.final, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled.log_probs, eager.log_probs, rtol=1e-4, atol=1e-4)
