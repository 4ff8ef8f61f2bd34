"""Object detection without neural weights: palette pixel classes -> components -> shapes.

1. Each pixel takes the nearest of the six object colours or the background colour; pixels
   farther than ``COLOR_THRESHOLD`` from every palette entry (off-palette smudges, blurry
   edges halfway between an object and the background) count as background.
2. 4-connected components per colour; components smaller than ``min_area(resolution)``
   (about a quarter of the smallest object's box) are dropped as noise.
3. The component's bounding box is compared pixel by pixel with the canonical circle, square
   and triangle rasterised at that box size (the renderer's own ``shape_mask``); the best
   agreement wins. A blob whose best agreement is below ``MIN_SHAPE_MATCH`` or whose box is
   more elongated than ``MAX_ASPECT`` is still an object but of unknown shape (``None``), so
   it counts against "no extra objects" without satisfying any shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from jagg_lab.worlds.shapes.components import label_components
from jagg_lab.worlds.shapes.scene import BACKGROUND, COLORS, PALETTE, SHAPES, shape_mask, size_range

__all__ = [
    "COLOR_THRESHOLD",
    "MIN_SHAPE_MATCH",
    "MAX_ASPECT",
    "Detection",
    "min_area",
    "classify_pixels",
    "classify_shape",
    "detect_batch",
    "detect",
]

# Palette entries are >= ~221 apart (background to any colour); a pixel must be within
# ~45% of that of an entry to be trusted. Gaussian noise of sigma 0.05 (13/255 per channel)
# moves a pixel by ~22 on average, far inside the threshold.
COLOR_THRESHOLD = 100.0
MIN_SHAPE_MATCH = 0.8
MAX_ASPECT = 2.0

_PALETTE_RGB = np.array([PALETTE[c] for c in COLORS] + [BACKGROUND], dtype=np.float32)  # [7, 3]
_BACKGROUND_INDEX = len(COLORS)
_SHIFT = 2  # pixels are classified on a 64-level-per-channel grid
_LEVELS = 256 >> _SHIFT


@dataclass(frozen=True)
class Detection:
    """A detected object. ``shape`` is None when the blob matches no template well enough.
    Box centre ``(cx, cy)`` and extent ``(width, height)`` in pixels; ``area`` in pixels;
    ``match`` = pixel agreement in [0, 1] with the chosen shape template."""

    shape: str | None
    color: str
    cx: float
    cy: float
    width: int
    height: int
    area: int
    match: float


def min_area(resolution: int) -> int:
    """Smallest component (pixels) kept as an object at ``resolution``."""
    return max(3, size_range(resolution)[0] ** 2 // 4)


@lru_cache(maxsize=1)
def _lookup() -> np.ndarray:
    """Class of every quantised colour: int8 [_LEVELS ** 3], indexed by (r, g, b) >> _SHIFT.

    Evaluated at each bin's centre, so thresholds are exact to within half a bin
    (~2.6 RGB units) - negligible next to the ~100 unit margins - while classifying a pixel
    becomes a single table lookup instead of seven distance computations.
    """
    centres = np.arange(_LEVELS, dtype=np.float32) * (1 << _SHIFT) + ((1 << _SHIFT) - 1) / 2
    r, g, b = np.meshgrid(centres, centres, centres, indexing="ij")
    x = np.stack([r.ravel(), g.ravel(), b.ravel()], axis=1)
    d2 = ((x[:, None, :] - _PALETTE_RGB[None, :, :]) ** 2).sum(axis=2)  # [_LEVELS ** 3, 7]
    nearest = d2.argmin(axis=1)
    best = d2[np.arange(len(x)), nearest]
    return np.where((nearest == _BACKGROUND_INDEX) | (best > COLOR_THRESHOLD**2), -1, nearest).astype(np.int8)


def classify_pixels(images: np.ndarray) -> np.ndarray:
    """Nearest-palette class per pixel.

    Args:
        images: uint8 [B, H, W, 3] RGB.

    Returns:
        int64 [B, H, W]: index into COLORS, or -1 for background / off-palette.
    """
    if images.dtype != np.uint8:
        raise TypeError(f"classify_pixels expects uint8 images, got {images.dtype}")
    q = (images >> _SHIFT).astype(np.int64)
    index = (q[..., 0] * _LEVELS + q[..., 1]) * _LEVELS + q[..., 2]
    return _lookup()[index].astype(np.int64)


def classify_shape(mask: np.ndarray) -> tuple[str | None, float]:
    """Best-matching shape for a component cropped to its bounding box: bool [h, w].
    Returns ``(shape or None, agreement in [0, 1])``."""
    h, w = mask.shape
    best_shape, best = None, -1.0
    for shape in SHAPES:
        agreement = 1.0 - np.count_nonzero(mask ^ shape_mask(shape, h, w)) / mask.size
        if agreement > best:
            best_shape, best = shape, agreement
    if best < MIN_SHAPE_MATCH or max(h, w) > MAX_ASPECT * min(h, w):
        return None, best
    return best_shape, best


def detect_batch(images: np.ndarray) -> list[list[Detection]]:
    """Detect objects in a batch.

    Args:
        images: [B, H, W, 3] RGB, uint8 (floats in 0..255 are rounded and clipped).

    Returns:
        One list of detections per image, in raster order of each object's first pixel.
    """
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be [B, H, W, 3], got shape {images.shape}")
    if images.dtype != np.uint8:
        images = np.clip(np.rint(images), 0, 255).astype(np.uint8)
    batch, height, width, _ = images.shape
    classes = classify_pixels(images)
    labels = label_components(classes)
    flat_labels = labels.ravel()
    pixels = np.flatnonzero(flat_labels >= 0)
    out: list[list[Detection]] = [[] for _ in range(batch)]
    if pixels.size == 0:
        return out
    roots, inverse, areas = np.unique(flat_labels[pixels], return_inverse=True, return_counts=True)
    # Per-component bounding boxes via one sort + reduceat instead of a Python loop over pixels.
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate(([0], np.cumsum(areas)[:-1]))
    ys = (pixels // width) % height
    xs = pixels % width
    y0 = np.minimum.reduceat(ys[order], starts)
    y1 = np.maximum.reduceat(ys[order], starts) + 1
    x0 = np.minimum.reduceat(xs[order], starts)
    x1 = np.maximum.reduceat(xs[order], starts) + 1
    color_of_root = classes.ravel()[roots]
    keep = np.flatnonzero(areas >= min_area(min(height, width)))
    for k in keep:
        root = int(roots[k])
        b = root // (height * width)
        crop = labels[b, y0[k] : y1[k], x0[k] : x1[k]] == root
        shape, match = classify_shape(crop)
        out[b].append(
            Detection(
                shape=shape,
                color=COLORS[int(color_of_root[k])],
                cx=float(x0[k] + x1[k]) / 2,
                cy=float(y0[k] + y1[k]) / 2,
                width=int(x1[k] - x0[k]),
                height=int(y1[k] - y0[k]),
                area=int(areas[k]),
                match=match,
            )
        )
    return out


def detect(image: np.ndarray) -> list[Detection]:
    """Detect objects in one RGB image [H, W, 3], uint8 (floats in 0..255 are rounded)."""
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"image must be [H, W, 3], got shape {image.shape}")
    return detect_batch(image[None])[0]
