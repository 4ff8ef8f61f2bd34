"""Rewards: (images, prompts, metadata) -> scores (B,)."""
from jagg_lab.rewards.base import Reward, check_scores
from jagg_lab.rewards.jpeg import JpegCompressibility, jpeg_size_kb
from jagg_lab.rewards.shapes import ShapesVerifierReward

__all__ = ["Reward", "check_scores", "JpegCompressibility", "jpeg_size_kb", "ShapesVerifierReward"]
