"""KL to a reference policy along the trained policy's SDE trajectories."""
import copy

import pytest
import torch
from torch import nn

from jagg_lab.evaluation import eval_prompts, trajectory_kl
from jagg_lab.sampling import noise_schedule, sde_std
from tests.conftest import randomized_policy


class Shifted(nn.Module):
    """base's velocity plus a constant: v = v_base + delta, guided or not."""

    def __init__(self, base: nn.Module, delta: float):
        super().__init__()
        self.base, self.delta = base, delta
        self.sample_shape = base.sample_shape

    def encode_prompts(self, prompts):
        return self.base.encode_prompts(prompts)

    def forward(self, x, s, cond):
        return self.base(x, s, cond) + self.delta


KL_KWARGS = dict(noise_level=0.7, guidance=3.0, seed=5, batch_size=4)


def test_kl_to_itself_is_zero_and_to_a_perturbed_policy_positive():
    base = randomized_policy(seed=0).eval()
    prompts = eval_prompts(4, seed=1)
    levels = noise_schedule(4, shift=3.0)
    assert trajectory_kl(base, base, prompts, levels, **KL_KWARGS).mean == 0.0
    assert trajectory_kl(copy.deepcopy(base), base, prompts, levels, **KL_KWARGS).mean == 0.0
    perturbed = copy.deepcopy(base)
    with torch.no_grad():
        for p in perturbed.dit.parameters():
            p.add_(0.02 * torch.randn_like(p))
    kl = trajectory_kl(perturbed, base, prompts, levels, **KL_KWARGS)
    assert kl.mean > 0 and all(k > 0 for k in kl.per_step) and len(kl.per_step) == 4
    assert kl.path == pytest.approx(3 * 32 * 32 * sum(kl.per_step))


def test_kl_matches_the_closed_form_for_a_constant_velocity_shift():
    """v - v_base = delta shifts the SDE mean by delta (1 + std_k^2 (1 - s) / (2 s)) (s' - s)."""
    base = randomized_policy(seed=1).eval()
    delta = 0.3
    levels = noise_schedule(5, shift=1.0)
    kl = trajectory_kl(Shifted(base, delta), base, eval_prompts(3, seed=2), levels, **KL_KWARGS)
    s = levels.tolist()
    for k, value in enumerate(kl.per_step):
        std_k, std = sde_std(s[k], s[k + 1], KL_KWARGS["noise_level"], s[1])
        shift = delta * (1 + std_k**2 * (1 - s[k]) / (2 * s[k])) * (s[k + 1] - s[k])
        assert value == pytest.approx(shift**2 / (2 * std**2), rel=1e-4)
