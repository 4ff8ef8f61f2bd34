"""docs/method.md section 8: the bias of plain JAGG, and `jagg_cv`, its unbiased control-variate form."""
import itertools
import warnings

import pytest
import torch

from jagg_lab.strategies import FullStrategy, JaggCVStrategy, JaggStrategy, jagg_cv_backward
from jagg_lab.strategies.bias import ErrorSums, bias_summary
from tests.conftest import cosine, flat_grad, make_module, rollout_and_advantages, strategy_gradient
from tests.strategies.test_strategies import rel_err


@pytest.fixture(scope="module")
def real():
    """A tiny DiT along a real 8-step shifted SDE rollout, with CFG and KL on."""
    module = make_module(guidance=3.0, beta=0.05, num_steps=8, train_fraction=1.0)
    rollout, advantages = rollout_and_advantages(module)
    full, _ = strategy_gradient(module, FullStrategy(), rollout, advantages)
    return module, rollout, advantages, full


class FixedInterior(JaggCVStrategy):
    """jagg_cv with the corrected interior step of each window given, not drawn."""

    def __init__(self, interior, **kwargs):
        super().__init__(**kwargs)
        self.interior = interior

    def backward(self, velocity_fn, states, noise_levels, step_loss_fn, velocities=None, on_policy=True):
        return jagg_cv_backward(velocity_fn, states, noise_levels, step_loss_fn, window=self.window,
                                velocities=velocities, mode=self.mode, interior=self.interior, proposal=self.proposal,
                                n_correct=self.n_correct)


def test_mean_over_every_corrected_step_is_the_full_gradient(real):
    module, rollout, advantages, full = real
    grads = []
    for interior in itertools.product(range(2), range(2)):  # windows [0..3], [4..7]: 2 interior steps each
        grad, stats = strategy_gradient(module, FixedInterior(list(interior), window=4), rollout, advantages)
        grads.append(grad)
        assert stats["backward_items"] == 6 and stats["backward_passes"] == 2 and stats["corrected_windows"] == 2
    assert rel_err(torch.stack(grads).mean(0), full) < 1e-4
    assert min(rel_err(g, full) for g in grads) > 1e-6  # each draw is an estimate, not the full gradient


def test_several_corrected_steps_mean_over_every_draw_is_the_full_gradient(real):
    module, rollout, advantages, full = real
    grads = []
    for pair in itertools.combinations(range(6), 2):  # one window [0..7]: 2 of its 6 interior steps
        grad, stats = strategy_gradient(module, FixedInterior([pair], window=8, n_correct=2), rollout, advantages)
        grads.append(grad)
        assert stats["backward_items"] == 4 and stats["backward_passes"] == 1 and stats["corrected_windows"] == 1
    assert rel_err(torch.stack(grads).mean(0), full) < 1e-4
    assert min(rel_err(g, full) for g in grads) > 1e-6
    # as many corrected steps as interior ones: every step exact, the window's full gradient
    grad, stats = strategy_gradient(module, JaggCVStrategy(window=4, n_correct=2), rollout, advantages)
    assert rel_err(grad, full) < 1e-4 and stats["backward_items"] == 8
    with pytest.raises(ValueError, match="interior"):
        strategy_gradient(module, FixedInterior([(1, 1)], window=8, n_correct=2), rollout, advantages)


def test_bend_proposal_is_unbiased_with_its_weights(real):
    module, rollout, advantages, full = real
    from jagg_lab.strategies.cv import interior_probabilities

    velocities = [rollout.velocities[:, k] for k in range(8)]
    levels = rollout.noise_levels.tolist()[:8]
    q = [interior_probabilities(steps, levels, velocities, "bend") for steps in ([0, 1, 2, 3], [4, 5, 6, 7])]
    assert all(abs(p.sum().item() - 1) < 1e-9 and (p > 0).all() for p in q)
    mean = 0
    for i, j in itertools.product(range(2), range(2)):
        grad, _ = strategy_gradient(module, FixedInterior([i, j], window=4, proposal="bend"), rollout, advantages)
        mean = mean + q[0][i].item() * q[1][j].item() * grad
    assert rel_err(mean, full) < 1e-4


def test_without_correction_it_is_plain_jagg_and_counts_its_items(real):
    module, rollout, advantages, _ = real
    jagg, _ = strategy_gradient(module, JaggStrategy(window=4, mode="cached"), rollout, advantages)
    plain, stats = strategy_gradient(module, FixedInterior([None, None], window=4), rollout, advantages)
    assert rel_err(plain, jagg) < 1e-5 and stats["backward_items"] == 4 and stats["corrected_windows"] == 0
    _, stats = strategy_gradient(module, FixedInterior([1, None], window=4), rollout, advantages)
    assert stats["backward_items"] == 5
    # W = 2 windows have no interior step: nothing to correct, exact
    grad, stats = strategy_gradient(module, JaggCVStrategy(window=2), rollout, advantages)
    assert stats["corrected_windows"] == 0 and rel_err(grad, real[3]) < 1e-4


def test_correct_prob_draws_are_seeded_and_resumable(real):
    module, rollout, advantages, _ = real
    strategy = JaggCVStrategy(window=4, correct_prob=0.5, seed=3)
    corrected = [strategy_gradient(module, strategy, rollout, advantages)[1]["corrected_windows"] for _ in range(12)]
    assert 0 < sum(corrected) < 24  # some windows corrected, some not
    state = strategy.state_dict()
    again = JaggCVStrategy(window=4, correct_prob=0.5, seed=99)
    again.load_state_dict(state)
    a, _ = strategy_gradient(module, strategy, rollout, advantages)
    b, _ = strategy_gradient(module, again, rollout, advantages)
    assert torch.equal(a, b)


def test_one_joint_backward_per_window_counted_with_hooks(real):
    module, rollout, advantages, _ = real
    calls = []
    warnings.filterwarnings("ignore", "Full backward hook is firing")
    handle = module.policy.dit.register_full_backward_hook(lambda *a: calls.append(1))
    try:
        strategy_gradient(module, JaggCVStrategy(window=4), rollout, advantages)
        assert len(calls) == 2  # 8 trained steps, W = 4: [x_a; x_r; x_b] in one pass per window
    finally:
        handle.remove()


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="correct_prob"):
        JaggCVStrategy(correct_prob=0.0)
    with pytest.raises(ValueError, match="proposal"):
        JaggCVStrategy(proposal="greedy")
    with pytest.raises(ValueError, match="mode"):
        JaggCVStrategy(mode="fast")
    with pytest.raises(ValueError, match="n_correct"):
        JaggCVStrategy(n_correct=0)
    with pytest.raises(ValueError, match="proposal"):
        JaggCVStrategy(n_correct=2, proposal="bend")


def constant_advantage_errors(strategies, n_rollouts=48):
    """With every advantage equal, E[full gradient] = 0 (the score identity: each step's
    upstream signal is a score times a constant, independent of x_k). Running error sums of
    each strategy against full, over independent rollouts of a tiny DiT."""
    module = make_module(guidance=1.0, num_steps=4, train_fraction=1.0, seed=1)
    sums = {name: ErrorSums() for name in strategies}
    fulls = ErrorSums()
    for i in range(n_rollouts):
        rollout, _ = rollout_and_advantages(module, seed=100 + i)
        advantages = torch.ones(rollout.states.shape[0])
        f, _ = strategy_gradient(module, FullStrategy(), rollout, advantages)
        fulls.add(f, torch.zeros_like(f))
        for name, strategy in strategies.items():
            g, _ = strategy_gradient(module, strategy, rollout, advantages)
            sums[name].add(g, f)
    return bias_summary(fulls), {name: bias_summary(s) for name, s in sums.items()}


def test_constant_advantage_exposes_jagg_bias_and_cv_removes_it():
    full, errors = constant_advantage_errors({"jagg": JaggStrategy(window=4), "jagg_cv": JaggCVStrategy(window=4, seed=0)})
    print(full, errors)
    assert full["z"] < 4  # the mean full gradient is zero within its noise
    assert errors["jagg"]["z"] > 10 and errors["jagg"]["halves_cosine"] > 0.5  # a systematic error
    assert errors["jagg_cv"]["z"] < 4  # unbiased: the error averages out
