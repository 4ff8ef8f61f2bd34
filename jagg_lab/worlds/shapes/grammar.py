"""Prompt grammar of the shapes world: text <-> Constraints, enumeration, splits, sampling.

Sentences (one canonical sentence per ``Constraints``)::

    single_object  a <shape>
    two_objects    a <shape> and a <shape>
    counting       <one|two|three|four> <shape|shapes>
    colors         a <color> <shape>
    position       a <shape> <to the left of|to the right of|above|below> a <shape>
    color_attr     a <color> <shape> and a <color> <shape>

Splits. Prompts are grouped by *meaning* (position prompts that say the same thing, e.g.
"a circle to the left of a square" / "a square to the right of a circle", share a group so
the held-out set is not leaked by its paraphrase). Within each category the groups are ranked
by a stable blake2b hash of their canonical text and the first ``round(0.2 * n_groups)`` are
held out, clamped to ``[1, n_groups - 1]``. Ranking (rather than thresholding the hash) gives
exactly ~20% per category and guarantees both splits are non-empty even for tiny categories:
single_object and two_objects have only 3 groups each, so exactly one of their prompts is
held out. That is a compositional hold-out, not a missing concept: the held-out shape still
appears in training through the other categories.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from itertools import combinations, product

import numpy as np

from jagg_lab.worlds.shapes.constraints import CATEGORIES, MAX_COUNT, Constraints, ObjectSpec
from jagg_lab.worlds.shapes.layout import sample_scene
from jagg_lab.worlds.shapes.relations import INVERSE_RELATION, RELATIONS
from jagg_lab.worlds.shapes.scene import COLORS, SHAPES

__all__ = [
    "SPLITS",
    "HELDOUT_FRACTION",
    "COUNT_WORDS",
    "VOCABULARY",
    "parse",
    "to_text",
    "all_constraints",
    "all_prompts",
    "split_of",
    "sample_prompt",
    "sample_scene",
]

SPLITS: tuple[str, ...] = ("train", "heldout")
HELDOUT_FRACTION = 0.2
COUNT_WORDS: tuple[str, ...] = ("one", "two", "three", "four")
_RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("to", "the", "left", "of"),
    "right": ("to", "the", "right", "of"),
    "above": ("above",),
    "below": ("below",),
}
_PLURAL: dict[str, str] = {s: s + "s" for s in SHAPES}
# Fixed order: token ids derive from it, so appending is fine but reordering breaks checkpoints.
VOCABULARY: tuple[str, ...] = (
    "a", "and", *COUNT_WORDS, *SHAPES, *_PLURAL.values(), *COLORS,
    "to", "the", "left", "right", "of", "above", "below",
)  # fmt: skip
_SPLIT_SALT = b"jagg_lab.worlds.shapes.split.v1"


def _object_text(o: ObjectSpec) -> str:
    return f"a {o.shape}" if o.color is None else f"a {o.color} {o.shape}"


def to_text(c: Constraints) -> str:
    """Canonical prompt for ``c``; ``parse(to_text(c)) == c``."""
    if c.category == "counting":
        shape = c.objects[0].shape
        return f"{COUNT_WORDS[c.count - 1]} {shape if c.count == 1 else _PLURAL[shape]}"
    if c.category == "position":
        assert c.relation is not None
        rel = " ".join(_RELATION_WORDS[c.relation])
        return f"{_object_text(c.objects[0])} {rel} {_object_text(c.objects[1])}"
    return " and ".join(_object_text(o) for o in c.objects)


def _parse_object(tokens: list[str]) -> ObjectSpec | None:
    """``a <shape>`` or ``a <color> <shape>``; None if ``tokens`` is neither."""
    if len(tokens) == 2 and tokens[0] == "a" and tokens[1] in SHAPES:
        return ObjectSpec(tokens[1])
    if len(tokens) == 3 and tokens[0] == "a" and tokens[1] in COLORS and tokens[2] in SHAPES:
        return ObjectSpec(tokens[2], tokens[1])
    return None


def _parse_tokens(tokens: list[str]) -> Constraints | None:
    if len(tokens) == 2 and tokens[0] in COUNT_WORDS:
        count = COUNT_WORDS.index(tokens[0]) + 1
        nouns = SHAPES if count == 1 else tuple(_PLURAL.values())
        if tokens[1] in nouns:
            return Constraints("counting", (ObjectSpec(SHAPES[nouns.index(tokens[1])]),), count=count)
        return None
    single = _parse_object(tokens)
    if single is not None:
        return Constraints("single_object" if single.color is None else "colors", (single,))
    if "and" in tokens:
        i = tokens.index("and")
        a, b = _parse_object(tokens[:i]), _parse_object(tokens[i + 1 :])
        if a is None or b is None or (a.color is None) != (b.color is None):
            return None
        return Constraints("two_objects" if a.color is None else "color_attr", (a, b))
    for relation, words in _RELATION_WORDS.items():
        n = len(words)
        if len(tokens) == 4 + n and tuple(tokens[2 : 2 + n]) == words:
            a, b = _parse_object(tokens[:2]), _parse_object(tokens[2 + n :])
            if a is None or b is None or a.color is not None or b.color is not None:
                return None
            return Constraints("position", (a, b), relation=relation)
    return None


@lru_cache(maxsize=65536)
def parse(text: str) -> Constraints:
    """Meaning of ``text`` (lower-cased, whitespace-split). Raises ValueError if the text is
    not a sentence of the grammar or describes an invalid combination."""
    tokens = text.lower().split()
    result = _parse_tokens(tokens)  # may itself raise ValueError from Constraints validation
    if result is None:
        raise ValueError(f"cannot parse prompt {text!r} with the shapes grammar")
    return result


def _enumerate(category: str) -> list[Constraints]:
    if category == "single_object":
        return [Constraints(category, (ObjectSpec(s),)) for s in SHAPES]
    if category == "two_objects":
        return [Constraints(category, (ObjectSpec(a), ObjectSpec(b))) for a, b in combinations(SHAPES, 2)]
    if category == "counting":
        return [
            Constraints(category, (ObjectSpec(s),), count=n) for s, n in product(SHAPES, range(1, MAX_COUNT + 1))
        ]
    if category == "colors":
        return [Constraints(category, (ObjectSpec(s, c),)) for s, c in product(SHAPES, COLORS)]
    if category == "position":
        return [
            Constraints(category, (ObjectSpec(a), ObjectSpec(b)), relation=r)
            for a, b, r in product(SHAPES, SHAPES, RELATIONS)
            if a != b
        ]
    if category == "color_attr":
        items = [ObjectSpec(s, c) for s, c in product(SHAPES, COLORS)]
        return [Constraints(category, (a, b)) for a, b in combinations(items, 2) if a.color != b.color]
    raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")


def all_constraints(category: str | None = None) -> list[Constraints]:
    """Every expressible meaning, in a fixed order; one category or all of them."""
    categories = CATEGORIES if category is None else (category,)
    return [c for cat in categories for c in _enumerate(cat)]


def _semantic_key(c: Constraints) -> str:
    """Text of the paraphrase-invariant representative of ``c`` (only position has paraphrases)."""
    if c.category == "position" and c.relation in ("right", "below"):
        c = Constraints("position", (c.objects[1], c.objects[0]), relation=INVERSE_RELATION[c.relation])
    return to_text(c)


def _stable_hash(text: str) -> int:
    # Python's hash() is salted per process; blake2b is stable across runs and machines.
    return int.from_bytes(hashlib.blake2b(_SPLIT_SALT + text.encode(), digest_size=8).digest(), "big")


@lru_cache(maxsize=1)
def _split_table() -> dict[Constraints, str]:
    table: dict[Constraints, str] = {}
    for category in CATEGORIES:
        members = _enumerate(category)
        keys = sorted({_semantic_key(c) for c in members}, key=lambda k: (_stable_hash(k), k))
        n_held = min(max(1, round(HELDOUT_FRACTION * len(keys))), len(keys) - 1)
        held = set(keys[:n_held])
        for c in members:
            table[c] = "heldout" if _semantic_key(c) in held else "train"
    return table


def split_of(c: Constraints) -> str:
    """``"train"`` or ``"heldout"`` for a meaning (see module docstring)."""
    return _split_table()[c]


@lru_cache(maxsize=64)
def _prompts(split: str, category: str | None) -> tuple[str, ...]:
    if split not in (*SPLITS, "all"):
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS} or 'all'")
    return tuple(to_text(c) for c in all_constraints(category) if split == "all" or split_of(c) == split)


def all_prompts(split: str, category: str | None = None) -> list[str]:
    """Canonical prompts of ``split`` ("train", "heldout" or "all"), in a fixed order."""
    return list(_prompts(split, category))


def sample_prompt(rng: np.random.Generator, split: str, category: str | None = None) -> str:
    """One prompt of ``split``: category uniform over CATEGORIES when None, then a prompt
    uniform within that category's share of the split."""
    if category is None:
        category = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
    pool = _prompts(split, category)
    return pool[int(rng.integers(len(pool)))]
