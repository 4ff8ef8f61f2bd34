"""Shared fixtures: a tiny DiT with non-trivial weights and a real rollout from it."""
from __future__ import annotations

import os

import pytest
import torch
from hydra import compose, initialize_config_dir

from jagg_lab import CONF_DIR
from jagg_lab.grpo import GRPOConfig, group_advantages
from jagg_lab.module import GRPOModule
from jagg_lab.policies import DiTPolicy, fill_zero_init_
from jagg_lab.rewards import JpegCompressibility
from jagg_lab.sampling import SDESampler
from jagg_lab.strategies import FullStrategy
from jagg_lab.strategies.core import flat_grad as core_flat_grad

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def randomized_policy(size: str = "XS", seed: int = 0, **kwargs) -> DiTPolicy:
    torch.manual_seed(seed)
    return fill_zero_init_(DiTPolicy(size=size, **kwargs), seed=seed)


def make_module(strategy=None, *, guidance: float = 1.0, beta: float = 0.0, num_steps: int = 8,
                train_fraction: float = 1.0, shift: float = 3.0, seed: int = 0, policy=None, objective=None,
                **grpo) -> GRPOModule:
    return GRPOModule(
        policy=policy or randomized_policy(seed=seed),
        sampler=SDESampler(num_steps=num_steps, shift=shift, guidance=guidance),
        reward=JpegCompressibility(),
        strategy=strategy or FullStrategy(),
        grpo=GRPOConfig(beta=beta, train_fraction=train_fraction, **grpo),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        group_size=4,
        seed=seed,
        sample_every=0,
        objective=objective,
    )


PROMPTS = ["a red circle", "two squares"]


def rollout_and_advantages(module: GRPOModule, prompts=PROMPTS, seed: int = 0):
    expanded = [p for p in prompts for _ in range(module.group_size)]
    rollout = module.make_rollout(expanded, torch.Generator().manual_seed(seed))
    rewards = module.reward(module.policy.decode(rollout.final), expanded, [{}] * len(expanded))
    group_ids = torch.arange(len(prompts)).repeat_interleave(module.group_size)
    return rollout, group_advantages(rewards, group_ids)


def flat_grad(module: GRPOModule) -> torch.Tensor:
    return core_flat_grad(module.trainable_parameters())


def strategy_gradient(module: GRPOModule, strategy, rollout, advantages, on_policy: bool = True):
    """The gradient one strategy accumulates over the whole rollout batch (one micro-batch)."""
    module.policy.zero_grad(set_to_none=True)
    module.strategy = strategy
    idx = torch.arange(rollout.states.shape[0])
    stats = module.micro_batch_backward(rollout, advantages, idx, 1.0, on_policy=on_policy)
    grad = flat_grad(module)
    module.policy.zero_grad(set_to_none=True)
    return grad, stats


@pytest.fixture
def hydra_cfg():
    """compose(overrides) -> the composed training config, as the CLI would see it."""

    def _compose(overrides=()):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name="train", overrides=list(overrides), return_hydra_config=False)

    return _compose


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item()
