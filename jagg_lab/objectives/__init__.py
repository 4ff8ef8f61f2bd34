"""The `objective/` config group: what a GRPO step optimises, behind one seam (`Objective`, the
stages `GRPOModule.training_step` calls; `objectives.base`).

`grpo` (the default, `TrajectoryGRPO`): the trajectory objective, the clipped GRPO loss of the
sampled SDE steps, with a gradient strategy deciding how its signals reach the parameters.
`awm` and `nft`: forward-process objectives (`ForwardObjective`), which train on the final
samples of ODE rollouts with the flow-matching loss at forward-noised states and never
back-propagate through the trajectory. All share the prompts, rewards, group advantages, the
optimizer, checkpoints, held-out evaluation and logging.
"""
from __future__ import annotations

from jagg_lab.objectives.awm import AWM
from jagg_lab.objectives.base import Objective
from jagg_lab.objectives.forward import ForwardObjective, Samples, SoftCopy, trajectory_settings_used
from jagg_lab.objectives.nft import DiffusionNFT
from jagg_lab.objectives.trajectory import TrajectoryGRPO

__all__ = ["Objective", "TrajectoryGRPO", "ForwardObjective", "AWM", "DiffusionNFT", "Samples", "SoftCopy",
           "trajectory_settings_used"]
