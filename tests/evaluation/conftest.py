"""Run directories as `jagg_lab.train` leaves them, as far as evaluation reads them, and a
policy class other than the DiT, for the run= path of `python -m jagg_lab.evaluate`."""
from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file
from torch import nn

from jagg_lab.policies import DiTPolicy
from jagg_lab.types import Cond

WRAPPED_TARGET = "tests.evaluation.conftest.WrappedDiT"


class WrappedDiT(nn.Module):
    """A VelocityPolicy that is not a DiTPolicy and has no `load`: evaluation must build and
    load it from its config alone."""

    def __init__(self, size: str = "XS", resolution: int = 16):
        super().__init__()
        self.inner = DiTPolicy(size=size, resolution=resolution)
        self.sample_shape = self.inner.sample_shape

    def encode_prompts(self, prompts: list[str]) -> Cond:
        return self.inner.encode_prompts(prompts)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.decode(x)

    def forward(self, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        return self.inner(x, s, cond)


def write_run(run_dir: Path, policy: nn.Module, policy_node: dict, seed: int = 0) -> Path:
    """config.yaml (seed, policy, sampler) and the exported policy.safetensors of a finished run."""
    run_dir.mkdir(parents=True)
    sampler = {"_target_": "jagg_lab.sampling.SDESampler", "num_steps": 4, "shift": 3.0, "noise_level": 0.7, "guidance": 3.0}
    OmegaConf.save(OmegaConf.create({"seed": seed, "policy": policy_node, "sampler": sampler}), run_dir / "config.yaml")
    if hasattr(policy, "save"):
        policy.save(run_dir / "policy.safetensors")
    else:
        save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, str(run_dir / "policy.safetensors"))
    return run_dir
