"""Evaluation on the shapes world: verifier accuracy of a policy (ODE samples on held-out
prompts) or of the verifier itself (fresh ground-truth renders).

    python -m jagg_lab.evaluate source=policy n_samples=128 seed=1 out=pol.json [checkpoint=PATH]
    python -m jagg_lab.evaluate source=ground_truth n_samples=256 seed=1 out=gt.json
    python -m jagg_lab.evaluate source=policy noise_level=0.7 num_steps=10 ...   # with GRPO's SDE sampler
    python -m jagg_lab.evaluate source=policy run=outputs/runs/RUN ...          # any trained policy
    python -m jagg_lab.evaluate ... base=base.json   # (or base=RUN/checkpoints/last.ckpt) and its paired gain over the base
    python -m jagg_lab.evaluate --help

The work is done by `jagg_lab.evaluation`; this module is its command line.
"""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from torch import nn

from jagg_lab import cli
from jagg_lab.checkpointing import load_checkpoint
from jagg_lab.evaluation.samples import check_categories
from jagg_lab.evaluation import eval_prompts, find_run, load_run_policy, paired_gain, sample_images, score_images
from jagg_lab.policies import DiTPolicy
from jagg_lab.worlds.shapes import render_batch

__all__ = ["EvalArgs", "build_policy", "evaluate", "main"]

log = logging.getLogger(__name__)

PROG = "python -m jagg_lab.evaluate"


@dataclass
class EvalArgs:
    """Verifier accuracy (strict and dense, per category and per sample) on held-out prompts.

    source=policy samples a policy: by default the shapes DiT of `size` and `resolution` with
    weights `checkpoint`; with run=DIR, the policy of a `jagg_lab.train` run instead, of any
    class: DIR/config.yaml's `policy` node built with hydra.utils.instantiate, its trained
    weights DIR/policy.safetensors loaded (run= may also name another weights file inside a
    run, e.g. DIR/checkpoints/step_000050.ckpt). The output then records the weights file as
    `checkpoint` and the run policy's `size` and `resolution`. source=ground_truth scores fresh
    renders, which measures the verifier. Evaluations with the same n_samples, seed, split,
    resolution and sampler settings share prompts and noise: experiments/paired.py compares
    them sample by sample.
    """

    source: str = "policy"  # policy | ground_truth
    n_samples: int = 128
    seed: int = 1  # fixes the prompts and the noise
    out: str | None = None  # JSON file for the result
    split: str = "heldout"
    checkpoint: str | None = "shipped"  # DiT weights: "shipped", a path, or null for random init
    size: str | None = "S"  # DiT size (XS, S, ...)
    resolution: int = 32
    num_steps: int = 20
    guidance: float = 3.0
    shift: float = 1.0
    noise_level: float = 0.0  # 0: the ODE; > 0: the SDE that GRPO samples with, at this noise level
    batch_size: int = 64
    grid: str | None = None  # optional PNG grid of the first 64 samples
    run: str | None = None  # a training run directory (or a weights file in one): its policy instead of the DiT
    device: str = "cpu"  # where the policy samples
    categories: list[str] | None = None  # only these shapes categories, in turn (null: all six)
    base: str | None = None  # grade against the base: its evaluation (JSON) of the same prompts and noise, or a run's .ckpt holding it

    def __post_init__(self) -> None:
        if self.categories is not None:
            check_categories(self.categories, "categories")
        if self.source not in ("policy", "ground_truth"):
            raise ValueError(f"source must be 'policy' or 'ground_truth', got {self.source!r}")
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {self.n_samples}")
        if self.noise_level < 0:
            raise ValueError(f"noise_level must be >= 0 (0 = ODE), got {self.noise_level}")


def build_policy(args: EvalArgs) -> tuple[nn.Module, EvalArgs]:
    """The policy to sample, in eval mode on args.device, and the args as evaluated (with run=,
    the weights file, size and resolution the run's policy has)."""
    if args.run is None:
        policy = DiTPolicy(size=args.size, resolution=args.resolution, checkpoint=args.checkpoint)
    else:
        run_dir, weights = find_run(args.run)
        node = OmegaConf.load(run_dir / "config.yaml").policy
        policy = load_run_policy(weights)
        args = replace(args, checkpoint=str(weights), size=node.get("size"),
                       resolution=node.get("resolution", policy.sample_shape[-1]))
    return policy.eval().to(args.device), args


def evaluate(args: EvalArgs) -> dict:
    """The evaluation as written to `out`: {"args": ..., n_samples, strict_accuracy, dense_score,
    per_sample, per_category}."""
    prompts = eval_prompts(args.n_samples, args.seed, args.split, args.categories)
    if args.source == "ground_truth":
        images = render_batch(prompts, np.random.default_rng(args.seed), args.resolution)
    else:
        policy, args = build_policy(args)
        images = sample_images(policy, prompts, seed=args.seed, num_steps=args.num_steps, guidance=args.guidance, shift=args.shift,
                               batch_size=args.batch_size, noise_level=args.noise_level)
    result = {"args": asdict(args), **score_images(images, prompts)}
    if args.grid:
        import torchvision

        torchvision.utils.save_image(images[:64], args.grid, nrow=8)
    return result


def base_gain(result: dict, base: str) -> dict:
    """The paired gain of `result` over the base: `base` is the base's evaluation (JSON) of the same
    prompts and noise, or a training checkpoint, whose held-out callback kept the base's scores on
    the verdict set and on the periodic set (the one of the same settings is used). ValueError
    when it holds none of this evaluation's prompts and noise."""
    if Path(base).suffix == ".ckpt":
        states = load_checkpoint(base, "base").get("callbacks", {}).values()
        candidates = [state[key] for state in states if isinstance(state, dict)
                      for key in ("final_base", "base") if state.get(key)]
    else:
        if not Path(base).is_file():
            raise FileNotFoundError(f"base: no such evaluation {base}")
        candidates = [json.loads(Path(base).read_text())]
    reasons = []
    for reference in candidates:
        try:
            return paired_gain(result, reference)
        except ValueError as err:
            reasons.append(str(err))
    raise ValueError(f"base: {base} holds no base scores on this evaluation's prompts and noise"
                     + (f" ({'; '.join(reasons)})" if reasons else " (none at all)"))


def _main(args: EvalArgs) -> int:
    try:
        result = evaluate(args)
        if args.base is not None:
            gain = base_gain(result, args.base)
            result["gain_over_base"] = {k: v for k, v in gain.items() if k != "per_category"}
            result["per_category_gain_over_base"] = gain["per_category"]
    except (ValueError, FileNotFoundError) as err:  # a checkpoint that is missing or does not fit
        sys.stderr.write(f"jagg_lab.evaluate: {err}\n")
        return 2
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    log.info("strict_accuracy=%.3f dense_score=%.3f (%s, n=%d)", result["strict_accuracy"], result["dense_score"], args.source, args.n_samples)
    for category, r in result["per_category"].items():
        log.info("  %-14s strict=%.3f dense=%.3f", category, r["strict_accuracy"], r["dense_score"])
    if "gain_over_base" in result:
        g = result["gain_over_base"]
        log.info("over the base (n=%d, paired): dense %+.3f ± %.3f, strict %+.3f ± %.3f", args.n_samples,
                 g["dense_gain"], g["dense_gain_se"], g["strict_gain"], g["strict_gain_se"])
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return cli.run(_main, EvalArgs, PROG, argv)


if __name__ == "__main__":
    sys.exit(main())
