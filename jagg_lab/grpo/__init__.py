"""GRPO: group advantages, the per-step loss as a function of the velocity, and its settings."""
from jagg_lab.grpo.advantages import group_advantages
from jagg_lab.grpo.config import GRPOConfig
from jagg_lab.grpo.loss import GRPOLoss, StepStats

__all__ = ["group_advantages", "GRPOConfig", "GRPOLoss", "StepStats"]
