"""A random share of blocks of the trained steps per micro-batch (grpo.block_size, grpo.block_fraction:
the JAGG authors' sum_sample and timestep_fraction): which steps a micro-batch trains, that its
gradient is the fixed-step gradient of exactly those steps, and that the draw is unbiased."""
import itertools
from collections import Counter

import pytest
import torch

from jagg_lab.grpo import GRPOConfig
from jagg_lab.grpo.config import draw_blocks
from jagg_lab.strategies import FullStrategy, JaggKnotsStrategy, JaggStrategy, SubsampleStrategy
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient


def test_a_draw_takes_whole_blocks_in_sampling_order_each_pair_equally_often():
    draws = Counter(draw_blocks(range(20), 5, 0.6, torch.Generator().manual_seed(i)) for i in range(600))
    blocks = [tuple(range(a, a + 5)) for a in range(0, 20, 5)]
    # int(4 * 0.6) = 2 of the 4 blocks, each pair as likely as any other
    assert set(draws) == {a + b for a, b in itertools.combinations(blocks, 2)}
    assert min(draws.values()) > 600 / 6 * 0.7
    # 21 steps: blocks of 5, 5, 5, 5 and a leftover 1; int(5 * 0.6) = 3 of them
    lengths = {len(draw_blocks(range(21), 5, 0.6, torch.Generator().manual_seed(i))) for i in range(50)}
    assert lengths == {11, 15}
    # at least one block, however small the fraction
    assert len(draw_blocks(range(10), 5, 0.1, torch.Generator().manual_seed(0))) == 5
    assert GRPOConfig().draw_blocks([0, 1, 2], None) == (0, 1, 2)  # nothing drawn by default


@pytest.mark.parametrize("bad, key", [
    (dict(block_fraction=0.5), "grpo.block_size"),
    (dict(block_size=5, block_fraction=0.0), "grpo.block_fraction"),
    (dict(block_size=5, block_fraction=1.5), "grpo.block_fraction"),
    (dict(block_size=0), "grpo.block_size"),
    (dict(block_size=2, block_fraction=0.5, sde_window=2), "grpo.sde_window"),
])
def test_bad_block_settings_are_named(bad, key):
    with pytest.raises(ValueError, match=key):
        GRPOConfig(**bad)


@pytest.mark.parametrize("strategy, message", [
    (JaggStrategy(window=4), "strategy.window = 4"),
    (JaggKnotsStrategy(knot_spacing=2), "across blocks"),
])
def test_a_strategy_that_would_link_steps_across_blocks_is_refused(strategy, message):
    with pytest.raises(ValueError, match=message):
        make_module(strategy, num_steps=10, block_size=5, block_fraction=0.6)
    for fits in (FullStrategy(), JaggStrategy(window=5), SubsampleStrategy(window=5)):
        make_module(fits, num_steps=10, block_size=5, block_fraction=0.6)


def _fixed(module, steps):
    """The module's objective over these fixed trained steps, nothing drawn."""
    return type(module.objective.loss)(loss=module.objective.loss.loss, trained_steps=tuple(steps), guidance=module.objective.loss.guidance)


def test_a_micro_batch_trains_exactly_its_drawn_blocks_and_draws_the_same_on_a_rerun():
    module = make_module(num_steps=8, block_size=2, block_fraction=0.5)
    rollout, adv = rollout_and_advantages(module)
    idx = torch.arange(rollout.states.shape[0])
    steps = module.objective.loss.micro_batch_steps(rollout, module.objective.block_generator(idx, module.rollouts_done))
    assert len(steps) == 4 and all(steps[i] % 2 == 0 and steps[i + 1] == steps[i] + 1 for i in (0, 2))
    got, stats = strategy_gradient(module, FullStrategy(), rollout, adv)
    assert stats["backward_items"] == 4
    assert torch.equal(got, strategy_gradient(module, FullStrategy(), rollout, adv)[0])  # same rollout, same draw
    drawn = module.objective.loss
    module.objective.loss = _fixed(module, steps)
    assert torch.allclose(got, strategy_gradient(module, FullStrategy(), rollout, adv)[0])
    module.objective.loss = drawn
    # the next rollouts draw afresh, and micro-batches of one rollout draw apart
    draws = {module.objective.loss.micro_batch_steps(rollout, module.objective.block_generator(idx, module.rollouts_done))}
    for r in range(1, 12):
        module.rollouts_done = r
        draws.add(module.objective.loss.micro_batch_steps(rollout, module.objective.block_generator(idx, module.rollouts_done)))
    assert len(draws) > 2
    module.rollouts_done = 0
    halves = {module.objective.loss.micro_batch_steps(rollout, module.objective.block_generator(idx[i:], module.rollouts_done)) for i in range(0, 8)}
    assert len(halves) > 1
    with pytest.raises(ValueError, match="generator"):
        module.objective.loss.micro_batch_steps(rollout, None)


def test_the_drawn_loss_averaged_over_every_draw_is_the_loss_of_every_block():
    """Equal blocks, the mean over the drawn steps: each pair of the 4 blocks is equally likely
    (above), so the mean gradient over the 6 pairs is the expected one; it equals full's over all 8 steps."""
    module = make_module(num_steps=8, block_size=2, block_fraction=0.5)
    rollout, adv = rollout_and_advantages(module)
    blocks = [(0, 1), (2, 3), (4, 5), (6, 7)]
    grads = []
    for a, b in itertools.combinations(blocks, 2):
        module.objective.loss = _fixed(module, a + b)
        grads.append(strategy_gradient(module, FullStrategy(), rollout, adv)[0])
    module.objective.loss = _fixed(module, range(8))
    every = strategy_gradient(module, FullStrategy(), rollout, adv)[0]
    assert torch.allclose(torch.stack(grads).mean(0), every, atol=1e-7, rtol=1e-5)
