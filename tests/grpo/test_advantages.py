import pytest
import torch

from jagg_lab.grpo import GRPOConfig, group_advantages


def test_group_advantages_have_zero_mean_and_unit_std_per_group():
    torch.manual_seed(0)
    rewards = torch.randn(24) * torch.tensor([1.0, 5.0, 0.1]).repeat_interleave(8) + torch.arange(3).repeat_interleave(8) * 10
    group_ids = torch.tensor([7, 3, 9]).repeat_interleave(8)
    adv = group_advantages(rewards, group_ids, std="group", clip_max=100)
    for g in (7, 3, 9):
        a = adv[group_ids == g]
        assert a.mean().abs() < 1e-5
        assert a.std(unbiased=False) == pytest.approx(1.0, abs=1e-2)


def test_global_std_keeps_group_means_at_zero_but_shares_the_scale():
    rewards = torch.tensor([0.0, 1.0, 10.0, 30.0])
    adv = group_advantages(rewards, torch.tensor([0, 0, 1, 1]), std="global", clip_max=100)
    assert adv[:2].sum().abs() < 1e-6 and adv[2:].sum().abs() < 1e-6
    assert (adv[3] - adv[2]) / (adv[1] - adv[0]) == pytest.approx(20.0, rel=1e-4)


def test_constant_group_gets_zero_advantage_and_clip_applies():
    adv = group_advantages(torch.tensor([1.0, 1.0, 0.0, 100.0]), torch.tensor([0, 0, 1, 1]), std="group", clip_max=0.5)
    assert torch.all(adv[:2] == 0)
    assert adv[2:].abs().max() == pytest.approx(0.5)


def test_group_config_validation_names_the_key():
    with pytest.raises(ValueError, match="train_fraction"):
        GRPOConfig(train_fraction=1.5)
    with pytest.raises(ValueError, match="micro_batch_size"):
        GRPOConfig(micro_batch_size=3).check_batch(16)
    with pytest.raises(ValueError, match="optimizer_steps_per_rollout"):
        GRPOConfig(optimizer_steps_per_rollout=3, micro_batch_size=1).check_batch(16)
    assert GRPOConfig(train_fraction=0.6).trained_steps(10) == [0, 1, 2, 3, 4, 5]
    assert GRPOConfig(train_steps=[1, 3]).trained_steps(10) == [1, 3]


def test_shuffled_advantages_control_keeps_the_values_but_not_their_samples():
    from tests.conftest import make_module

    rewards = torch.arange(16, dtype=torch.float32)
    group_ids = torch.arange(4).repeat_interleave(4)
    real = make_module().advantages(rewards, group_ids)
    control = make_module(shuffle_advantages=True).advantages(rewards, group_ids)
    assert torch.equal(control.sort().values, real.sort().values)
    assert not torch.equal(control, real)
