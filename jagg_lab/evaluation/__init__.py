"""Evaluation of policies and runs, one job per module.

    samples   held-out prompts and images of any policy from seeded noise (ODE, or GRPO's SDE)
    verifier  the shapes verifier's scores, per category and per sample
    paired    gains over a reference evaluation of the same prompts and noise, with paired errors
    kl        KL to a reference policy along the trained policy's SDE trajectories
    fid       FID / KID against the world's renders on the shapes feature network
    loading   the trained policy (and its base and sampler) of a training run directory
    quality   all of the above for one trained policy: a run's eval.json
    runs      training runs on disk as tables (metrics.csv, config.yaml, eval.json)

`python -m jagg_lab.evaluate` is the command line over samples, verifier and loading.
"""
from jagg_lab.evaluation.fid import (
    DEFAULT_KID_SUBSET_SIZE, default_feature_net, fid_kid, reference_images, reference_prompts,
)
from jagg_lab.evaluation.kl import TrajectoryKL, trajectory_kl
from jagg_lab.evaluation.loading import EXPORTED_WEIGHTS, find_run, load_policy_weights, load_run_policy, run_policies
from jagg_lab.evaluation.paired import PAIRING_FREE, paired_gain
from jagg_lab.evaluation.quality import policy_quality
from jagg_lab.evaluation.samples import eval_categories, eval_prompts, sample_images
from jagg_lab.evaluation.verifier import score_images

__all__ = [
    "eval_categories", "eval_prompts", "sample_images", "score_images", "PAIRING_FREE", "paired_gain",
    "TrajectoryKL", "trajectory_kl", "DEFAULT_KID_SUBSET_SIZE", "default_feature_net", "fid_kid", "reference_images",
    "reference_prompts", "EXPORTED_WEIGHTS", "find_run", "load_policy_weights", "load_run_policy", "run_policies",
    "policy_quality",
]
