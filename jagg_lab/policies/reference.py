"""The frozen reference policy of the KL term: the policy as training starts."""
from __future__ import annotations

import copy

import torch
from torch import nn

from jagg_lab.types import Cond

__all__ = ["AdaptersOff", "reference_policy"]


class AdaptersOff:
    """The base model under a LoRA policy: calls the policy with its adapters disabled.
    A plain callable (not an nn.Module) so the policy's weights are not registered twice."""

    def __init__(self, policy: nn.Module):
        self.policy = policy

    def __call__(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        with self.policy.adapters_disabled():
            return self.policy(x, s, cond)


def reference_policy(policy: nn.Module):
    """Its LoRA adapters switched off when the policy has them (no copy of a large model),
    else a frozen copy."""
    if getattr(policy, "has_adapters", False):
        return AdaptersOff(policy)
    return copy.deepcopy(policy).requires_grad_(False).eval()
