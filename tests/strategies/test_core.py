"""The interpolating core: a bound on the rows of a joint pass changes memory, not the gradient."""
import warnings

import pytest
import torch

from jagg_lab.strategies import JaggCVStrategy, JaggKnotsStrategy, JaggRoutedStrategy, JaggStrategy, Segment
from tests.conftest import make_module, rollout_and_advantages, strategy_gradient
from tests.strategies.test_strategies import rel_err


@pytest.fixture(scope="module")
def real():
    module = make_module(guidance=3.0, beta=0.05, num_steps=8, train_fraction=1.0)
    rollout, advantages = rollout_and_advantages(module)
    return module, rollout, advantages


@pytest.mark.parametrize("make", [
    lambda bound: JaggStrategy(window=4, max_pass_items=bound),
    lambda bound: JaggStrategy(window=4, mode="interpolated", max_pass_items=bound),
    lambda bound: JaggRoutedStrategy(window=4, cos_threshold=-1.0, max_pass_items=bound),
    lambda bound: JaggCVStrategy(window=4, seed=5, max_pass_items=bound),
    lambda bound: JaggKnotsStrategy(knot_spacing=3, max_pass_items=bound),
])
def test_one_item_per_pass_gives_the_same_gradient_in_more_passes(real, make):
    module, rollout, advantages = real
    whole, whole_stats = strategy_gradient(module, make(None), rollout, advantages)
    calls = []
    warnings.filterwarnings("ignore", "Full backward hook is firing")
    handle = module.policy.dit.register_full_backward_hook(lambda *a: calls.append(1))
    try:
        split, split_stats = strategy_gradient(module, make(1), rollout, advantages)
    finally:
        handle.remove()
    assert rel_err(split, whole) < 1e-4
    assert split_stats["backward_items"] == whole_stats["backward_items"]
    # every backward pass carries one batch of B rows, as `full`'s do
    assert len(calls) == split_stats["backward_passes"] == split_stats["backward_items"] > whole_stats["backward_passes"]


def test_bad_bounds_and_segments_name_the_key():
    with pytest.raises(ValueError, match="max_pass_items"):
        JaggStrategy(max_pass_items=0)
    with pytest.raises(ValueError, match="max_pass_items"):
        JaggCVStrategy(max_pass_items=0)
    with pytest.raises(ValueError, match="backwards"):
        Segment(3, 1)
    with pytest.raises(ValueError, match="interior"):
        Segment(0, 3, corrections=((3, 2.0),))
    with pytest.raises(ValueError, match="repeat"):
        Segment(0, 3, corrections=((1, 2.0), (1, 2.0)))


def test_micro_batch_stats_combine_counts_by_sum_and_the_rest_by_mean():
    from jagg_lab.strategies.core import combine_stats

    parts = [{"backward_items": 4, "corrected_windows": 1, "jagg_frac": 1.0, "knot_1": 3, "grad_cosine": 0.9},
             {"backward_items": 5, "corrected_windows": 0, "jagg_frac": 0.0, "knot_1": 3}]
    assert combine_stats(parts) == {"backward_items": 9, "corrected_windows": 1, "jagg_frac": 0.5, "knot_1": 3,
                                    "grad_cosine": 0.9}
