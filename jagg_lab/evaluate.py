"""Evaluation on the shapes world: verifier accuracy of a policy (ODE samples on held-out
prompts) or of the verifier itself (fresh ground-truth renders).

    python -m jagg_lab.evaluate source=policy n_samples=128 seed=1 out=pol.json [checkpoint=PATH]
    python -m jagg_lab.evaluate source=ground_truth n_samples=256 seed=1 out=gt.json
    python -m jagg_lab.evaluate source=policy noise_level=0.7 num_steps=10 ...   # with GRPO's SDE sampler
"""
from __future__ import annotations

import json
import logging
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from jagg_lab.policies import DiTPolicy, guided_velocity
from jagg_lab.sampling import noise_schedule, ode_sample, sde_rollout
from jagg_lab.worlds.shapes import CATEGORIES, render_batch, sample_prompt, verify_batch

__all__ = ["EvalArgs", "eval_categories", "eval_prompts", "sample_images", "score_images", "paired_gain", "main"]

log = logging.getLogger(__name__)


@dataclass
class EvalArgs:
    source: str = "policy"  # policy | ground_truth
    n_samples: int = 128
    seed: int = 1
    out: str | None = None
    split: str = "heldout"
    checkpoint: str | None = "shipped"  # "shipped", a path, or null for random init
    size: str = "S"
    resolution: int = 32
    num_steps: int = 20
    guidance: float = 3.0
    shift: float = 1.0
    noise_level: float = 0.0  # 0: the ODE; > 0: the SDE that GRPO samples with, at this noise level
    batch_size: int = 64
    grid: str | None = None  # optional PNG grid of the first 64 samples


def eval_categories(n: int) -> list[str]:
    """The category of each of `eval_prompts`' n prompts: the categories in turn, so each gets n / 6."""
    return [CATEGORIES[i % len(CATEGORIES)] for i in range(n)]


def eval_prompts(n: int, seed: int, split: str = "heldout") -> list[str]:
    """n prompts of the categories `eval_categories(n)`, deterministic in seed."""
    rng = np.random.default_rng(seed)
    return [sample_prompt(rng, split, category) for category in eval_categories(n)]


@torch.inference_mode()
def sample_images(
    policy, prompts: list[str], *, seed: int, num_steps: int = 20, guidance: float = 3.0, shift: float = 1.0, batch_size: int = 64,
    noise_level: float = 0.0,
) -> torch.Tensor:
    """ODE samples with classifier-free guidance, (B, 3, H, W) in [0, 1]; fixed noise per seed.
    With `noise_level` > 0, samples of the SDE that GRPO trains with instead."""
    generator = torch.Generator().manual_seed(seed)
    levels = noise_schedule(num_steps, shift)
    device = next(policy.parameters()).device
    null_cond = policy.encode_prompts([""])
    images = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        cond = policy.encode_prompts(chunk)
        noise = torch.randn((len(chunk), *policy.sample_shape), generator=generator).to(device)
        velocity_fn = lambda x, s: guided_velocity(policy, x, s, cond, null_cond, guidance)  # noqa: E731
        if noise_level > 0:
            x = sde_rollout(velocity_fn, noise, levels.to(device), noise_level=noise_level, cond=cond, null_cond=null_cond,
                            generator=generator).final
        else:
            x = ode_sample(velocity_fn, noise, levels.to(device))
        images.append(policy.decode(x).cpu())
    return torch.cat(images)


def score_images(images: torch.Tensor, prompts: list[str]) -> dict:
    """strict_accuracy, dense_score, both per category, and per sample (in prompt order, so two
    policies scored on the same prompts and seed can be compared sample by sample)."""
    dense, strict, categories = verify_batch(images, prompts)
    result = {"n_samples": len(prompts), "strict_accuracy": strict.float().mean().item(), "dense_score": dense.mean().item(),
              "per_sample": {"strict": strict.int().tolist(), "dense": dense.tolist()}, "per_category": {}}
    for category in CATEGORIES:
        mask = torch.tensor([c == category for c in categories])
        if mask.any():
            result["per_category"][category] = {
                "n": int(mask.sum()),
                "strict_accuracy": strict[mask].float().mean().item(),
                "dense_score": dense[mask].mean().item(),
            }
    return result


# settings that may differ between two evaluations compared sample by sample (the rest fix the prompts and noise)
_PAIRING_FREE = ("checkpoint", "out", "grid", "size")


def paired_gain(result: dict, reference: dict) -> dict:
    """Scores of an evaluation and its gain over `reference`, an evaluation of the same prompts
    and noise, with the standard error of the paired per-sample difference (far smaller than
    that of two independent accuracies, since both policies face the same samples); overall
    and per category of the evaluation prompts."""
    args, ref_args = result.get("args", {}), reference.get("args", {})
    differ = sorted(k for k in args.keys() | ref_args.keys() if k not in _PAIRING_FREE and args.get(k) != ref_args.get(k))
    if differ:
        raise ValueError(f"evaluations are not on the same prompts and noise: {', '.join(f'{k} {args.get(k)!r} vs {ref_args.get(k)!r}' for k in differ)}")
    diffs = {key: [a - b for a, b in zip(result["per_sample"][key], reference["per_sample"][key], strict=True)]
             for key in ("strict", "dense")}
    categories = eval_categories(len(diffs["strict"]))
    per_category = {category: _gains({key: [d for d, c in zip(diff, categories) if c == category] for key, diff in diffs.items()})
                    for category in dict.fromkeys(categories)}
    return {"strict_accuracy": result["strict_accuracy"], "dense_score": result["dense_score"], **_gains(diffs),
            "per_category": per_category}


def _gains(diffs: dict[str, list[float]]) -> dict[str, float]:
    """Mean and standard error of each list of paired differences, as KEY_gain and KEY_gain_se."""
    out = {}
    for key, diff in diffs.items():
        out[f"{key}_gain"] = statistics.fmean(diff)
        out[f"{key}_gain_se"] = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else 0.0
    return out


def run(args: EvalArgs) -> dict:
    if args.source not in ("policy", "ground_truth"):
        raise ValueError(f"source must be 'policy' or 'ground_truth', got {args.source!r}")
    if args.n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {args.n_samples}")
    if args.noise_level < 0:
        raise ValueError(f"noise_level must be >= 0 (0 = ODE), got {args.noise_level}")
    prompts = eval_prompts(args.n_samples, args.seed, args.split)
    if args.source == "ground_truth":
        images = render_batch(prompts, np.random.default_rng(args.seed), args.resolution)
    else:
        policy = DiTPolicy(size=args.size, resolution=args.resolution, checkpoint=args.checkpoint).eval()
        images = sample_images(policy, prompts, seed=args.seed, num_steps=args.num_steps, guidance=args.guidance, shift=args.shift,
                               batch_size=args.batch_size, noise_level=args.noise_level)
    result = {"args": asdict(args), **score_images(images, prompts)}
    if args.grid:
        import torchvision

        torchvision.utils.save_image(images[:64], args.grid, nrow=8)
    return result


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        args = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EvalArgs), OmegaConf.from_cli(argv if argv is not None else sys.argv[1:])))
        result = run(args)
    except (OmegaConfBaseException, ValueError, FileNotFoundError) as err:
        sys.stderr.write(f"jagg_lab.evaluate: {err}\n")
        return 2
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    log.info("strict_accuracy=%.3f dense_score=%.3f (%s, n=%d)", result["strict_accuracy"], result["dense_score"], args.source, args.n_samples)
    for category, r in result["per_category"].items():
        log.info("  %-14s strict=%.3f dense=%.3f", category, r["strict_accuracy"], r["dense_score"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
