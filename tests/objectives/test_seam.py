"""The objective seam: an objective defined here alone (no change to the package) trains from a
config, the module calls the same stages whatever the objective, and the frozen copies an
objective keeps are neither submodules nor checkpoint entries."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jagg_lab.grpo.loss import StepStats
from jagg_lab.objectives import AWM, Objective, TrajectoryGRPO
from jagg_lab.policies.base import guided_velocity_fn
from jagg_lab.sampling.rollout import ode_integrate
from jagg_lab.types import Cond, index_cond, training_copy
from tests.conftest import make_module, rollout_and_advantages
from tests.objectives.test_training import FORWARD
from tests.test_train_cli import read_rows, train


@dataclass(frozen=True)
class Finals:
    final: torch.Tensor  # what the module decodes and rewards
    cond: Cond
    null_cond: Cond
    forwards: int = 0


class RewardWeightedMatching(Objective):
    """A minimal forward objective: Euler ODE samples, then each sample's flow-matching loss at
    noise level 0.5, weighted by its advantage (reward-weighted regression on the policy's own samples)."""

    name = "rwm"

    def sample(self, policy, params, cond, null_cond, noise, generator, shard=(0, 1), index=0, sampler=None):
        levels = (sampler or self.sampler).noise_levels(policy).tolist()
        with torch.inference_mode():
            final, calls = ode_integrate(guided_velocity_fn(policy, cond, null_cond, 1.0), noise, levels, "euler")
        return training_copy(Finals(final=final, cond=cond, null_cond=null_cond, forwards=calls))

    def backward(self, policy, params, batch, weights, idx, scale=1.0, on_policy=True, shard=(0, 1), index=0):
        x0 = batch.final[idx]
        eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(index)).to(x0)
        s = torch.full((len(idx),), 0.5, device=x0.device)
        v = guided_velocity_fn(policy, index_cond(batch.cond, idx), batch.null_cond, 1.0)(0.5 * x0 + 0.5 * eps, s)
        mse = (v - (eps - x0)).pow(2).flatten(1).mean(1)
        loss = (weights[idx].clamp(min=0) * mse).mean()
        (loss * scale).backward()
        zero = torch.zeros(())
        stats = StepStats(loss=loss.detach(), policy_loss=loss.detach(), kl=zero, clip_frac=zero, approx_kl=zero,
                          ratio_mean=torch.ones(()))
        return {"backward_passes": 1, "backward_items": 1, "grad_forwards": 1, "nograd_forwards": 0,
                "loss": loss.item()}, [stats]


def test_an_objective_defined_outside_the_package_trains_from_a_config(tmp_path):
    run = tmp_path / "run"
    # the shipped base: an untrained DiT samples one image for every noise (equal rewards, no gradient)
    train(f"objective._target_={__name__}.RewardWeightedMatching", "trainer.max_steps=2", "sample_every=0",
          f"hydra.run.dir={run}", *FORWARD)
    rows = read_rows(run / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert all(float(r["grad_norm"]) > 0 and float(r["backward_passes"]) == 2 for r in rows)  # one per micro-batch
    assert (run / "policy.safetensors").is_file()


def test_the_module_keeps_an_objectives_frozen_copies_out_of_its_submodules_and_checkpoints():
    """A KL reference made by the objective is no submodule (Lightning warned of 112 modules in
    eval mode at the start of every AWM run with a KL term) and no part of the state dict."""
    for objective in (AWM(kl_weight=0.1), TrajectoryGRPO()):
        module = make_module(beta=0.01, objective=objective)
        assert module.objective.ref_policy is not None
        module.train()
        assert all(m.training for m in module.modules())
        assert not any(key.startswith("ref_policy.") for key in module.state_dict())
        module.double()  # moves and casts of the module reach them (as the trainer's move to its device)
        assert next(module.objective.ref_policy.parameters()).dtype == torch.float64


def test_the_trajectory_objective_is_the_default_and_sees_the_strategy_the_module_is_given():
    module = make_module()
    assert isinstance(module.objective, TrajectoryGRPO) and module.objective.strategy is module.strategy
    rollout, advantages = rollout_and_advantages(module)
    assert module.objective.reference_calls(rollout) == 0 and rollout.trained_steps is None
