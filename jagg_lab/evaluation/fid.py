"""Distribution metrics for the quality table: FID and KID against the world's ground truth.

Both use torchmetrics (``FrechetInceptionDistance`` / ``KernelInceptionDistance``) with the
shapes-world feature network (``jagg_lab.worlds.shapes.features``, 64-dim standardised
features) in place of Inception, so nothing is downloaded and the features respond to shape,
colour, count and layout rather than to ImageNet texture.

Typical use::

    prompts = reference_prompts(500, seed=0)              # generate images for these prompts
    generated = ...                                        # float [500, 3, 32, 32] in [0, 1]
    reference = reference_images(500, seed=1)              # fresh GT renders, same prompt mix
    fid_kid(generated, reference)                          # {"fid": ..., "kid_mean": ..., "kid_std": ...}

Caveats:

* FID is biased upward at small n (the covariance estimates are noisy): even two independent
  ground-truth sets of a few hundred images score well above 0, and the bias shrinks as n
  grows. Only compare FIDs computed with the same n (generated and reference) and the same
  feature network. KID is unbiased in n (its mean can go slightly negative), which makes it
  the better number for small sets; its ``kid_std`` is the spread over random subsets, not a
  standard error of the mean.
* Numbers are in units of the standardised feature space (unit variance per dimension on GT),
  not comparable with Inception FIDs from the literature.
* The metrics compare unpaired image distributions: they see what is drawn, not whether it
  matches each image's prompt. Pair them with the verifier's per-prompt accuracy.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor, nn

from jagg_lab.worlds.shapes import CATEGORIES, render_batch, sample_prompt
from jagg_lab.worlds.shapes.features import load_feature_net

__all__ = ["DEFAULT_KID_SUBSET_SIZE", "default_feature_net", "fid_kid", "reference_images", "reference_prompts"]

DEFAULT_KID_SUBSET_SIZE = 100


@lru_cache(maxsize=1)
def default_feature_net() -> nn.Module:
    """The shipped shapes feature network (loaded once, CPU, eval mode)."""
    return load_feature_net()


def reference_prompts(n: int, seed: int, split: str = "heldout", categories: Sequence[str] | None = None) -> list[str]:
    """``n`` prompts of ``split``, category-balanced: categories (default: all ``CATEGORIES``)
    in round-robin order, each prompt uniform within its category's share of the split."""
    cats = tuple(CATEGORIES if categories is None else categories)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9E7]))
    return [sample_prompt(rng, split, cats[i % len(cats)]) for i in range(n)]


def reference_images(
    n: int, seed: int, resolution: int = 32, split: str = "heldout", categories: Sequence[str] | None = None
) -> Tensor:
    """Ground-truth renders for ``reference_prompts(n, seed, split, categories)``: float32
    [n, 3, resolution, resolution] in [0, 1]. Different seeds give independent sets."""
    prompts = reference_prompts(n, seed, split, categories)
    return render_batch(prompts, np.random.default_rng(np.random.SeedSequence([seed, 0x5CE])), resolution)


class _SharedFeatures(nn.Module):
    """Wraps the feature network for the two metrics: FID and KID are updated with the same
    chunk one after the other, so the second call reuses the first call's features."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        if hasattr(net, "num_features"):
            self.num_features = net.num_features
        self._last: tuple[Tensor, Tensor] | None = None

    def forward(self, images: Tensor) -> Tensor:
        if self._last is None or self._last[0] is not images:
            self._last = (images, self.net(images))
        return self._last[1]


def _check_images(name: str, images: Tensor) -> Tensor:
    if not torch.is_tensor(images) or images.ndim != 4 or images.shape[1] != 3:
        shape = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
        raise ValueError(f"{name} must be a float tensor [B, 3, H, W] in [0, 1], got {shape}")
    if images.shape[0] < 2:
        raise ValueError(f"{name} needs at least 2 images, got {images.shape[0]}")
    if not images.is_floating_point():
        raise ValueError(f"{name} must be floating point in [0, 1], got dtype {images.dtype}")
    return images.float().clamp(0.0, 1.0)


@torch.no_grad()
def fid_kid(
    generated: Tensor,
    reference: Tensor,
    feature_net: nn.Module | None = None,
    kid_subset_size: int | None = None,
    kid_subsets: int = 100,
    batch_size: int = 500,
    seed: int = 0,
) -> dict[str, float]:
    """FID and KID between ``generated`` [B, 3, H, W] and ``reference`` [N, 3, H, W] images.

    Images are float in [0, 1] (clamped), H = W in {16, 32, 64} (the feature network works at
    32 px and resizes); B and N may differ but each must be >= 2. ``feature_net`` maps float
    [b, 3, H, W] in [0, 1] to [b, D] features (default: the shipped shapes feature network).
    KID uses ``kid_subsets`` random subsets of ``kid_subset_size`` images from each side
    (default ``min(100, B, N)``), drawn from a generator seeded with ``seed`` (the global
    torch RNG is left untouched). Returns ``{"fid", "kid_mean", "kid_std"}`` as floats.

    FID is biased upward for small sets: compare values only at equal B and N (see module
    docstring).
    """
    from torchmetrics.image.fid import FrechetInceptionDistance
    from torchmetrics.image.kid import KernelInceptionDistance

    generated = _check_images("generated", generated)
    reference = _check_images("reference", reference)
    net = default_feature_net() if feature_net is None else feature_net
    was_training = net.training
    net.eval()
    device = generated.device
    net.to(device)
    subset = min(DEFAULT_KID_SUBSET_SIZE if kid_subset_size is None else kid_subset_size, generated.shape[0], reference.shape[0])
    try:
        shared = _SharedFeatures(net)
        fid = FrechetInceptionDistance(feature=shared, normalize=True).to(device)
        with warnings.catch_warnings():  # "will save all extracted features in buffer": 64 floats/image
            warnings.filterwarnings("ignore", message=".*will save all extracted features.*")
            kid = KernelInceptionDistance(feature=shared, normalize=True, subsets=kid_subsets, subset_size=subset).to(device)
        for images, real in ((reference, True), (generated, False)):
            for chunk in images.to(device).split(batch_size):
                fid.update(chunk, real=real)
                kid.update(chunk, real=real)
        fid_value = fid.compute()
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            kid_mean, kid_std = kid.compute()
    finally:
        net.train(was_training)
    return {"fid": float(fid_value), "kid_mean": float(kid_mean), "kid_std": float(kid_std)}
