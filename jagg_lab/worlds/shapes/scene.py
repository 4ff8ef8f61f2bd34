"""Palette, scene description and hard-edged rasterisation for the shapes world.

Colours sit on the corners of the RGB cube (pairwise distance >= 255) and the background is
mid gray (128, 128, 128), the centre of the cube: it is equally far (~221) from every object
colour, so nearest-colour pixel classification has the same margin for all colours, and it maps
to ~0 in [-1, 1] model space, so "empty canvas" is the easiest thing for a generator to predict.

Geometry is in pixel units. An object with ``size`` s occupies the s x s box whose top-left
corner is ``(cx - s/2, cy - s/2)``; the sampler keeps that corner on integer pixels so the
box, and hence the rendered mask, is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = [
    "SHAPES",
    "COLORS",
    "PALETTE",
    "BACKGROUND",
    "SUPPORTED_RESOLUTIONS",
    "DEFAULT_RESOLUTION",
    "SceneObject",
    "Scene",
    "size_range",
    "min_gap",
    "canvas_margin",
    "shape_mask",
    "render",
]

SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
COLORS: tuple[str, ...] = ("red", "green", "blue", "yellow", "magenta", "cyan")
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "magenta": (255, 0, 255),
    "cyan": (0, 255, 255),
}
BACKGROUND: tuple[int, int, int] = (128, 128, 128)
SUPPORTED_RESOLUTIONS: tuple[int, ...] = (16, 32, 64)
DEFAULT_RESOLUTION = 32


def size_range(resolution: int) -> tuple[int, int]:
    """Inclusive ``(min, max)`` object side length in pixels at ``resolution``.

    Roughly 19%-31% of the canvas; never below 4 px because a 3 px "circle" rasterises to a
    full 3x3 block and would be indistinguishable from a square.
    """
    return max(4, round(resolution * 0.1875)), max(4, round(resolution * 0.3125))


def min_gap(resolution: int) -> int:
    """Minimum empty pixels between two objects' boxes (keeps them separate components)."""
    return max(2, resolution // 16)


def canvas_margin(resolution: int) -> int:
    """Minimum empty pixels between an object's box and the canvas border."""
    return max(1, resolution // 32)


@dataclass(frozen=True)
class SceneObject:
    """One object: ``shape`` in SHAPES, ``color`` in COLORS, box centre ``(cx, cy)`` and side
    length ``size``, all in pixels (x to the right, y downwards)."""

    shape: str
    color: str
    cx: float
    cy: float
    size: int

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; expected one of {SHAPES}")
        if self.color not in PALETTE:
            raise ValueError(f"unknown color {self.color!r}; expected one of {COLORS}")
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")

    @property
    def box(self) -> tuple[int, int, int, int]:
        """Pixel box ``(x0, y0, x1, y1)``, half-open, rounded to the pixel grid."""
        x0 = int(round(self.cx - self.size / 2))
        y0 = int(round(self.cy - self.size / 2))
        return x0, y0, x0 + self.size, y0 + self.size


@dataclass(frozen=True)
class Scene:
    """A list of non-overlapping objects on a square ``resolution`` x ``resolution`` canvas."""

    objects: tuple[SceneObject, ...]
    resolution: int = DEFAULT_RESOLUTION

    def __post_init__(self) -> None:
        # Accept any sequence but store a tuple so scenes stay hashable.
        object.__setattr__(self, "objects", tuple(self.objects))
        if self.resolution < 8:
            raise ValueError(f"resolution must be >= 8, got {self.resolution}")


@lru_cache(maxsize=4096)
def _shape_mask_cached(shape: str, height: int, width: int) -> np.ndarray:
    ys = (np.arange(height, dtype=np.float64) + 0.5)[:, None]
    xs = (np.arange(width, dtype=np.float64) + 0.5)[None, :]
    eps = 1e-9  # pixel centres exactly on the boundary count as inside
    if shape == "square":
        mask = np.ones((height, width), dtype=bool)
    elif shape == "circle":
        u = (xs - width / 2) / (width / 2)
        v = (ys - height / 2) / (height / 2)
        mask = u * u + v * v <= 1.0 + eps
    elif shape == "triangle":
        # Upright: row i (0 = top) spans half-width (i + 1) / height * width / 2, i.e. the
        # triangle is sampled at each row's bottom edge so the apex row is never empty.
        half = (np.arange(height, dtype=np.float64)[:, None] + 1) / height * (width / 2)
        mask = np.abs(xs - width / 2) <= half + eps
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    mask.setflags(write=False)  # cached and shared: callers must not mutate it
    return mask


def shape_mask(shape: str, height: int, width: int) -> np.ndarray:
    """Canonical rasterised ``shape`` filling a ``height`` x ``width`` box: bool [height, width].

    The renderer and the verifier's template matching share this function, so a freshly
    rendered object matches its own template exactly. Read-only (cached).
    """
    return _shape_mask_cached(shape, int(height), int(width))


def render(scene: Scene) -> np.ndarray:
    """Rasterise ``scene``: uint8 [H, W, 3] with H = W = scene.resolution.

    Hard edges, no anti-aliasing, deterministic. Objects are painted in order; the sampler
    guarantees they do not overlap. Raises ValueError if an object leaves the canvas.
    """
    res = scene.resolution
    image = np.empty((res, res, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    for obj in scene.objects:
        x0, y0, x1, y1 = obj.box
        if x0 < 0 or y0 < 0 or x1 > res or y1 > res:
            raise ValueError(f"object {obj} leaves the {res}x{res} canvas")
        region = image[y0:y1, x0:x1]
        region[shape_mask(obj.shape, obj.size, obj.size)] = PALETTE[obj.color]
    return image
