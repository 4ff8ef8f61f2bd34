"""Sample a ground-truth ``Scene`` that satisfies a ``Constraints`` exactly.

The scene holds exactly the described objects (nothing extra). Unconstrained colours are
drawn uniformly from the palette (independently per object, so the colour marginal is
balanced). Object boxes keep ``min_gap`` pixels between each other and ``canvas_margin``
pixels to the border, so every object is its own connected component. For ``position`` the
two boxes are disjoint along the relation's axis and the pair satisfies exactly the requested
relation and no other (``relations_between`` returns just that one), so e.g. "left of" is
never also "above".
"""

from __future__ import annotations

import numpy as np

from jagg_lab.worlds.shapes.constraints import Constraints
from jagg_lab.worlds.shapes.relations import relations_between
from jagg_lab.worlds.shapes.scene import COLORS, Scene, SceneObject, canvas_margin, min_gap, size_range

__all__ = ["sample_scene"]

_MAX_ATTEMPTS = 2000
_SHRINK_EVERY = 50  # after this many failed scenes, lower the largest allowed size by one pixel
_TRIES_PER_OBJECT = 30

Box = tuple[int, int, int]  # (x0, y0, size)


def _separated(a: Box, b: Box, gap: int) -> bool:
    ax, ay, as_ = a
    bx, by, bs = b
    return bx >= ax + as_ + gap or ax >= bx + bs + gap or by >= ay + as_ + gap or ay >= by + bs + gap


def _place_free(sizes: list[int], rng: np.random.Generator, resolution: int) -> list[Box] | None:
    """Sequential rejection sampling of non-touching boxes; None if the canvas filled up."""
    margin, gap = canvas_margin(resolution), min_gap(resolution)
    boxes: list[Box] = []
    for size in sizes:
        hi = resolution - margin - size
        for _ in range(_TRIES_PER_OBJECT):
            box = (int(rng.integers(margin, hi + 1)), int(rng.integers(margin, hi + 1)), size)
            if all(_separated(box, other, gap) for other in boxes):
                boxes.append(box)
                break
        else:
            return None
    return boxes


def _place_pair(sizes: list[int], relation: str, rng: np.random.Generator, resolution: int) -> list[Box] | None:
    """Boxes ``[A, B]`` with "A <relation> B" holding and no other relation; None on failure."""
    margin, gap = canvas_margin(resolution), min_gap(resolution)
    # The object with the smaller coordinate along the relation's axis comes first.
    first, second = (0, 1) if relation in ("left", "above") else (1, 0)
    s_first, s_second = sizes[first], sizes[second]
    hi_first = resolution - margin - s_first - gap - s_second
    if hi_first < margin:
        return None
    p_first = int(rng.integers(margin, hi_first + 1))
    p_second = int(rng.integers(p_first + s_first + gap, resolution - margin - s_second + 1))
    primary = {first: p_first, second: p_second}
    orth = {i: int(rng.integers(margin, resolution - margin - sizes[i] + 1)) for i in (0, 1)}
    horizontal = relation in ("left", "right")
    boxes = [
        (primary[i], orth[i], sizes[i]) if horizontal else (orth[i], primary[i], sizes[i]) for i in (0, 1)
    ]
    (ax, ay, as_), (bx, by, bs) = boxes
    found = relations_between((ax + as_ / 2, ay + as_ / 2), (as_, as_), (bx + bs / 2, by + bs / 2), (bs, bs))
    return boxes if found == {relation} else None


def sample_scene(c: Constraints, rng: np.random.Generator, resolution: int = 32) -> Scene:
    """A random scene satisfying ``c`` exactly at ``resolution`` (16, 32 or 64 px tested)."""
    shapes = [o.shape for o in c.objects] * (c.count if c.category == "counting" else 1)
    colors = [
        o.color if o.color is not None else COLORS[int(rng.integers(len(COLORS)))]
        for o in c.objects
        for _ in range(c.count if c.category == "counting" else 1)
    ]
    lo, hi = size_range(resolution)
    for attempt in range(_MAX_ATTEMPTS):
        # Crowded scenes (four objects at 16 px) may not fit at the largest sizes: shrink slowly.
        top = max(lo, hi - attempt // _SHRINK_EVERY)
        sizes = [int(s) for s in rng.integers(lo, top + 1, size=len(shapes))]
        if c.category == "position":
            assert c.relation is not None
            boxes = _place_pair(sizes, c.relation, rng, resolution)
        else:
            boxes = _place_free(sizes, rng, resolution)
        if boxes is not None:
            objects = tuple(
                SceneObject(shape, color, x0 + size / 2, y0 + size / 2, size)
                for shape, color, (x0, y0, size) in zip(shapes, colors, boxes)
            )
            return Scene(objects, resolution)
    raise RuntimeError(f"could not lay out {c} on a {resolution}px canvas in {_MAX_ATTEMPTS} attempts")
