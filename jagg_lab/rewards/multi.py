"""A weighted sum of rewards, each also logged on its own."""
from __future__ import annotations

import torch

from jagg_lab.rewards.base import Reward, check_scores

__all__ = ["MultiReward"]


class MultiReward(Reward):
    """reward = sum_name weights[name] * rewards[name](images, prompts, metadata).

    components: "reward" (the weighted sum), "<name>" (each reward's own, unweighted score, which
    the module logs as `reward_<name>`) and "<name>_<key>" for each side value that reward reports.
    Every reward must have a weight and every weight a reward, so a typo in a config key fails
    at build time instead of silently dropping a term.
    """

    name = "multi"

    def __init__(self, rewards: dict[str, Reward], weights: dict[str, float]):
        rewards, weights = dict(rewards), {k: float(v) for k, v in dict(weights).items()}
        if not rewards:
            raise ValueError("reward.rewards is empty")
        if set(rewards) != set(weights):
            missing = sorted(set(rewards) - set(weights))
            extra = sorted(set(weights) - set(rewards))
            raise ValueError(f"reward.weights must name exactly the rewards: missing weights for {missing}, weights without a reward {extra}")
        bad = [k for k in rewards if k == "reward" or "." in k]
        if bad:
            raise ValueError(f"reward.rewards: invalid component names {bad}")
        self.rewards = rewards
        self.weights = weights
        self.name = "+".join(f"{weights[k]:g}*{k}" for k in rewards)

    def components(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> dict[str, torch.Tensor]:
        batch = images.shape[0]
        total = torch.zeros(batch)
        out: dict[str, torch.Tensor] = {}
        for key, reward in self.rewards.items():
            parts = reward.components(images, prompts, metadata)
            score = check_scores(parts["reward"], batch, f"{self.name}/{key}").cpu()
            total = total + self.weights[key] * score
            out[key] = score
            out.update({f"{key}_{k}": v for k, v in parts.items() if k != "reward"})
        out["reward"] = total
        return out
