"""Synthetic worlds: procedurally generated text-to-image tasks with programmatic rewards.

Each world lives in its own subpackage (``jagg_lab.worlds.shapes`` is the CPU default) and
needs nothing downloaded: prompts come from a grammar, ground-truth images from a renderer,
and rewards from a verifier without neural weights.
"""

__all__: list[str] = []
