"""GenEval-style programmatic reward for the shapes world.

A prompt's meaning (``Constraints``) is turned into a list of yes/no checks on the detected
objects. ``dense`` is the share of checks passed, ``strict`` is all of them. Every category
ends with an *exact total* check (the image holds exactly as many objects as the prompt
describes), which is what rules out "draw everything" false positives:

=============  ================================================================================
single_object  shape present | exact total (1)
two_objects    shape A present | shape B present | exact total (2)
counting       shape present | exactly N of that shape | exact total (N)
colors         shape present | shape present in the right colour | exact total (1)
position       shape A present | shape B present | some A is <relation> some B | exact total (2)
color_attr     enough of shape A | enough of shape B | coloured A present | coloured B present |
               exact total (2)   ("enough" = as many as the prompt names, 2 if A and B share
               a shape)
=============  ================================================================================

A blank canvas therefore scores dense 0 for every prompt.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from jagg_lab.worlds.shapes.constraints import Constraints
from jagg_lab.worlds.shapes.detection import Detection, detect, detect_batch
from jagg_lab.worlds.shapes.grammar import parse
from jagg_lab.worlds.shapes.relations import relation_holds

__all__ = ["Verdict", "constraint_checks", "verify", "verify_batch"]


@dataclass(frozen=True)
class Verdict:
    """Reward for one (image, prompt): ``dense`` in [0, 1], ``strict`` = all checks pass."""

    dense: float
    strict: bool
    category: str


def _has(dets: list[Detection], shape: str, color: str | None = None) -> bool:
    return any(d.shape == shape and (color is None or d.color == color) for d in dets)


def _related(dets: list[Detection], a: str, b: str, relation: str) -> bool:
    return any(
        relation_holds(relation, (da.cx, da.cy), (da.width, da.height), (db.cx, db.cy), (db.width, db.height))
        for da in dets
        if da.shape == a
        for db in dets
        if db.shape == b
    )


def constraint_checks(detections: list[Detection], c: Constraints) -> tuple[bool, ...]:
    """Outcome of each check of ``c`` (see module docstring) on the detected objects."""
    shapes = Counter(d.shape for d in detections)
    exact_total = len(detections) == c.n_objects
    objs = c.objects
    if c.category == "single_object":
        return shapes[objs[0].shape] >= 1, exact_total
    if c.category == "two_objects":
        return shapes[objs[0].shape] >= 1, shapes[objs[1].shape] >= 1, exact_total
    if c.category == "counting":
        n = shapes[objs[0].shape]
        return n >= 1, n == c.count, exact_total
    if c.category == "colors":
        return shapes[objs[0].shape] >= 1, _has(detections, objs[0].shape, objs[0].color), exact_total
    if c.category == "position":
        assert c.relation is not None
        a, b = objs[0].shape, objs[1].shape
        return shapes[a] >= 1, shapes[b] >= 1, _related(detections, a, b, c.relation), exact_total
    if c.category == "color_attr":
        needed = Counter(o.shape for o in objs)
        return (
            shapes[objs[0].shape] >= needed[objs[0].shape],
            shapes[objs[1].shape] >= needed[objs[1].shape],
            _has(detections, objs[0].shape, objs[0].color),
            _has(detections, objs[1].shape, objs[1].color),
            exact_total,
        )
    raise ValueError(f"unknown category {c.category!r}")


def _verdict(detections: list[Detection], c: Constraints) -> Verdict:
    checks = constraint_checks(detections, c)
    return Verdict(dense=sum(checks) / len(checks), strict=all(checks), category=c.category)


def verify(image: np.ndarray, prompt: str) -> Verdict:
    """Score one image against one prompt.

    Args:
        image: uint8 [H, W, 3] RGB.
        prompt: a sentence of the shapes grammar (ValueError otherwise).
    """
    if image.dtype != np.uint8:
        # A float image in [0, 1] would silently read as an all-black canvas.
        raise TypeError(f"verify expects a uint8 image, got {image.dtype}; use verify_batch for floats")
    c = parse(prompt)
    return _verdict(detect(image), c)


def verify_batch(images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Score a batch (any device; work happens on CPU in numpy).

    Args:
        images: float [B, 3, H, W] in [0, 1] (values outside are clamped).
        prompts: B sentences of the shapes grammar.

    Returns:
        ``(dense float32 [B], strict bool [B], categories)`` on CPU.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W], got shape {tuple(images.shape)}")
    if images.shape[0] != len(prompts):
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    constraints = [parse(p) for p in prompts]
    # Quantise like a saved PNG would, so batch and single-image scores agree exactly.
    pixels = (images.detach().float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)
    pixels = pixels.permute(0, 2, 3, 1).cpu().numpy()
    verdicts = [_verdict(d, c) for d, c in zip(detect_batch(pixels), constraints)]
    dense = torch.tensor([v.dense for v in verdicts], dtype=torch.float32)
    strict = torch.tensor([v.strict for v in verdicts], dtype=torch.bool)
    return dense, strict, [v.category for v in verdicts]
