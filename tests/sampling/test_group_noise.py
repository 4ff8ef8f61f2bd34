"""sampler.group_noise: the samples of a prompt group start from one initial noise."""
import dataclasses

import torch

from tests.conftest import make_module


def test_group_noise_is_shared_within_groups_and_differs_between_them(monkeypatch):
    module = make_module(num_steps=4)
    module.sampler = dataclasses.replace(module.sampler, group_noise=True)
    noise = module.initial_noise(8, torch.Generator().manual_seed(0))  # 2 groups of group_size 4
    assert all(torch.equal(noise[i], noise[4 * (i // 4)]) for i in range(8))
    assert not torch.equal(noise[0], noise[4])
    # Two processes of 4 rows each hold the same rows as one process of 8.
    monkeypatch.setattr(type(module), "shard", property(lambda self: (1, 2)))
    assert torch.equal(module.initial_noise(4, torch.Generator().manual_seed(0)), noise[4:])


def test_a_group_rollout_differs_only_by_the_sde_noise():
    module = make_module(num_steps=4)
    module.sampler = dataclasses.replace(module.sampler, group_noise=True)
    rollout = module.make_rollout(["a red circle"] * 4 + ["two squares"] * 4, torch.Generator().manual_seed(0))
    first = rollout.states[:, 0]
    assert torch.equal(first[0], first[3]) and not torch.equal(first[0], first[4])
    assert not torch.equal(rollout.final[0], rollout.final[1])  # the SDE's noise still separates them
