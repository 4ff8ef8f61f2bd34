"""Velocity models behind one call v(x, s, cond), and classifier-free guidance."""
from jagg_lab.policies.base import VelocityPolicy, guided_velocity, guided_velocity_fn
from jagg_lab.policies.dit import DIT_SIZES, DiT, DiTConfig, TextEncoder
from jagg_lab.policies.dit_policy import SHIPPED_CHECKPOINT, DiTPolicy, fill_zero_init_

__all__ = ["VelocityPolicy", "guided_velocity", "guided_velocity_fn", "DIT_SIZES", "DiT", "DiTConfig", "TextEncoder", "DiTPolicy", "SHIPPED_CHECKPOINT", "fill_zero_init_"]
