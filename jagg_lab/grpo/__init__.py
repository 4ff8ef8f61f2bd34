"""GRPO: group advantages, the per-step loss as a function of the velocity, the objective of a
rollout (loss closures and the gradient phase), and its settings."""
from jagg_lab.grpo.advantages import expand_groups, group_advantages
from jagg_lab.grpo.config import GRPOConfig
from jagg_lab.grpo.loss import GRPOLoss, StepStats
from jagg_lab.grpo.objective import GRPOObjective, rollout_advantages

__all__ = ["group_advantages", "expand_groups", "GRPOConfig", "GRPOLoss", "StepStats", "GRPOObjective", "rollout_advantages"]
