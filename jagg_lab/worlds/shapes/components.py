"""Connected-component labelling of class maps in pure numpy (scipy is not available).

Vectorised over a whole batch and over foreground pixels only (objects cover ~15% of a
canvas): min-label propagation along the 4-neighbour edges joining equal classes, plus
pointer jumping (``label = label[label]``), which converges in a handful of passes for the
compact blobs of this world instead of one pass per pixel of component diameter.
"""

from __future__ import annotations

import numpy as np

__all__ = ["label_components"]


def _edges(join: np.ndarray, pixel_ids: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Compact ids ``(first, second)`` of the pixel pairs where ``join`` is set; ``join`` is
    indexed by the first pixel and ``step`` is the flat offset to the second."""
    first = np.flatnonzero(join)
    return pixel_ids[first], pixel_ids[first + step]


def label_components(classes: np.ndarray, background: int = -1) -> np.ndarray:
    """4-connected components of equal, non-background class.

    Args:
        classes: int array [B, H, W]; pixels equal to ``background`` belong to no component.
            Components never cross image boundaries within the batch.
        background: class value that is not labelled.

    Returns:
        int64 array [B, H, W]: ``-1`` for background, otherwise the flat index
        (into ``classes.ravel()``) of the component's first pixel in raster order, so labels
        are unique across the batch and equal within a component.
    """
    if classes.ndim != 3:
        raise ValueError(f"classes must be [B, H, W], got shape {classes.shape}")
    _, _, width = classes.shape
    fg = classes != background
    fg_pixels = np.flatnonzero(fg)
    out = np.full(classes.shape, -1, dtype=np.int64)
    if fg_pixels.size == 0:
        return out
    # Compact id of every foreground pixel; raster order is kept, so the smallest compact id
    # in a component is also its first pixel.
    pixel_ids = np.full(classes.size, -1, dtype=np.int64)
    pixel_ids[fg_pixels] = np.arange(fg_pixels.size)
    # Pad the join masks back to [B, H, W] so flat positions line up with ``classes.ravel()``.
    join_h = np.zeros_like(fg)
    join_h[:, :, :-1] = fg[:, :, :-1] & (classes[:, :, :-1] == classes[:, :, 1:])
    join_v = np.zeros_like(fg)
    join_v[:, :-1, :] = fg[:, :-1, :] & (classes[:, :-1, :] == classes[:, 1:, :])
    edges = [_edges(join_h, pixel_ids, 1), _edges(join_v, pixel_ids, width)]
    labels = np.arange(fg_pixels.size)
    while True:
        new = labels.copy()
        for a, b in edges:
            # Within one direction every pixel is the first end of at most one edge and the
            # second end of at most one, so plain fancy assignment has no duplicate indices.
            m = np.minimum(new[a], new[b])
            new[a] = m
            new[b] = np.minimum(new[b], m)
        # Pointer jumping: a label is a pixel of the same component, so following it stays
        # inside the component and shortcuts long propagation chains.
        new = new[new]
        if np.array_equal(new, labels):
            break
        labels = new
    out.ravel()[fg_pixels] = fg_pixels[labels]
    return out
