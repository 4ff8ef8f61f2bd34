"""What "left of / right of / above / below" means in the shapes world.

Follows GenEval's rule: take the centre offset of A relative to B, shrink each axis by
``POSITION_THRESHOLD`` times the summed box extents on that axis (so objects that nearly share
a column are "neither left nor right"), and report a relation when the shrunk component along
its axis is more than half the length of the raw offset (the direction is within 60 degrees of
the axis). Both the ground-truth layout sampler and the verifier use this one definition.
"""

from __future__ import annotations

import math

__all__ = ["RELATIONS", "INVERSE_RELATION", "POSITION_THRESHOLD", "relations_between", "relation_holds"]

RELATIONS: tuple[str, ...] = ("left", "right", "above", "below")
INVERSE_RELATION: dict[str, str] = {"left": "right", "right": "left", "above": "below", "below": "above"}
POSITION_THRESHOLD = 0.1


def relations_between(
    a_center: tuple[float, float],
    a_extent: tuple[float, float],
    b_center: tuple[float, float],
    b_extent: tuple[float, float],
) -> frozenset[str]:
    """Relations of A with respect to B. Centres ``(x, y)`` and extents ``(w, h)`` in pixels,
    y pointing down. Returns a subset of RELATIONS (possibly empty, at most one per axis)."""
    dx = a_center[0] - b_center[0]
    dy = a_center[1] - b_center[1]
    norm = math.hypot(dx, dy)
    if norm == 0.0:
        return frozenset()
    rx = max(abs(dx) - POSITION_THRESHOLD * (a_extent[0] + b_extent[0]), 0.0) * math.copysign(1.0, dx)
    ry = max(abs(dy) - POSITION_THRESHOLD * (a_extent[1] + b_extent[1]), 0.0) * math.copysign(1.0, dy)
    out = set()
    if rx / norm < -0.5:
        out.add("left")
    if rx / norm > 0.5:
        out.add("right")
    if ry / norm < -0.5:
        out.add("above")
    if ry / norm > 0.5:
        out.add("below")
    return frozenset(out)


def relation_holds(
    relation: str,
    a_center: tuple[float, float],
    a_extent: tuple[float, float],
    b_center: tuple[float, float],
    b_extent: tuple[float, float],
) -> bool:
    """True when "A is <relation> B" (see module docstring)."""
    if relation not in RELATIONS:
        raise ValueError(f"unknown relation {relation!r}; expected one of {RELATIONS}")
    return relation in relations_between(a_center, a_extent, b_center, b_extent)
