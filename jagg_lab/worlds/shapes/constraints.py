"""Canonical symbolic form of a shapes-world prompt.

A ``Constraints`` value is what a prompt *means*; ``grammar.to_text`` and ``grammar.parse``
convert between it and the one canonical sentence. Categories mirror GenEval:

==============  ====================================  ==========================================
category        example                               fields used
==============  ====================================  ==========================================
single_object   "a circle"                            objects=(circle,)
two_objects     "a circle and a square"               objects=(circle, square), distinct shapes
counting        "three triangles"                     objects=(triangle,), count in 1..4
colors          "a red circle"                        objects=(red circle,)
position        "a circle to the left of a square"    objects=(A, B), relation of A w.r.t. B
color_attr      "a red circle and a blue square"      objects=(red circle, blue square),
                                                      distinct colours (shapes may repeat)
==============  ====================================  ==========================================

For the unordered categories (two_objects, color_attr) the objects are sorted into canonical
order on construction so that equal meanings compare and hash equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from jagg_lab.worlds.shapes.relations import RELATIONS
from jagg_lab.worlds.shapes.scene import COLORS, SHAPES

__all__ = ["CATEGORIES", "MAX_COUNT", "ObjectSpec", "Constraints"]

CATEGORIES: tuple[str, ...] = ("single_object", "two_objects", "counting", "colors", "position", "color_attr")
MAX_COUNT = 4


@dataclass(frozen=True)
class ObjectSpec:
    """A described object: ``shape`` in SHAPES and ``color`` in COLORS, or None = any colour."""

    shape: str
    color: str | None = None

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; expected one of {SHAPES}")
        if self.color is not None and self.color not in COLORS:
            raise ValueError(f"unknown color {self.color!r}; expected one of {COLORS}")

    def sort_key(self) -> tuple[int, int]:
        """Canonical order: by shape, then colour (uncoloured first)."""
        return SHAPES.index(self.shape), -1 if self.color is None else COLORS.index(self.color)


@dataclass(frozen=True)
class Constraints:
    """Canonical, hashable meaning of a prompt (see module docstring for the field layout).

    ``count`` is only meaningful for ``counting`` (1 elsewhere); ``relation`` only for
    ``position`` (None elsewhere) and reads "objects[0] is <relation> objects[1]".
    Raises ValueError for combinations the grammar cannot express.
    """

    category: str
    objects: tuple[ObjectSpec, ...]
    count: int = 1
    relation: str | None = None

    def __post_init__(self) -> None:
        objs = tuple(self.objects)
        if self.category in ("two_objects", "color_attr"):
            objs = tuple(sorted(objs, key=ObjectSpec.sort_key))
        object.__setattr__(self, "objects", objs)
        self._validate()

    def _validate(self) -> None:
        cat, objs = self.category, self.objects
        if cat not in CATEGORIES:
            raise ValueError(f"unknown category {cat!r}; expected one of {CATEGORIES}")
        expected_len = 2 if cat in ("two_objects", "position", "color_attr") else 1
        if len(objs) != expected_len:
            raise ValueError(f"{cat} needs {expected_len} object(s), got {len(objs)}")
        coloured = cat in ("colors", "color_attr")
        if any((o.color is not None) != coloured for o in objs):
            raise ValueError(f"{cat} objects must {'' if coloured else 'not '}have colours: {objs}")
        if cat in ("two_objects", "position") and objs[0].shape == objs[1].shape:
            raise ValueError(f"{cat} needs two different shapes, got {objs[0].shape!r} twice")
        if cat == "color_attr" and objs[0].color == objs[1].color:
            raise ValueError(f"color_attr needs two different colours, got {objs[0].color!r} twice")
        if cat == "counting":
            if not 1 <= self.count <= MAX_COUNT:
                raise ValueError(f"count must be in 1..{MAX_COUNT}, got {self.count}")
        elif self.count != 1:
            raise ValueError(f"count is only used by counting, got count={self.count} for {cat}")
        if cat == "position":
            if self.relation not in RELATIONS:
                raise ValueError(f"position needs a relation in {RELATIONS}, got {self.relation!r}")
        elif self.relation is not None:
            raise ValueError(f"relation is only used by position, got {self.relation!r} for {cat}")

    @property
    def n_objects(self) -> int:
        """How many objects a scene satisfying these constraints contains, exactly."""
        return self.count if self.category == "counting" else len(self.objects)
