"""Shapes world: compositional text-to-image prompts with a GenEval-style programmatic verifier.

Coloured circles, squares and triangles on a gray canvas (16/32/64 px). Prompts come from a
small grammar covering GenEval's six categories, ground truth from a hard-edged renderer, and
rewards from a weight-free detector, so pretraining and RL run on CPU with nothing downloaded.

Typical use::

    rng = np.random.default_rng(0)
    prompt = sample_prompt(rng, "train")                 # e.g. "a red circle and a blue square"
    image = render(sample_scene(parse(prompt), rng))      # uint8 [32, 32, 3]
    verdict = verify(image, prompt)                       # Verdict(dense=1.0, strict=True, ...)
"""

from jagg_lab.worlds.shapes.constraints import CATEGORIES, MAX_COUNT, Constraints, ObjectSpec
from jagg_lab.worlds.shapes.dataset import ShapesDataset, render_batch
from jagg_lab.worlds.shapes.detection import Detection, detect, detect_batch
from jagg_lab.worlds.shapes.grammar import (
    SPLITS,
    VOCABULARY,
    all_constraints,
    all_prompts,
    parse,
    sample_prompt,
    sample_scene,
    split_of,
    to_text,
)
from jagg_lab.worlds.shapes.relations import RELATIONS, relation_holds
from jagg_lab.worlds.shapes.scene import (
    BACKGROUND,
    COLORS,
    DEFAULT_RESOLUTION,
    PALETTE,
    SHAPES,
    SUPPORTED_RESOLUTIONS,
    Scene,
    SceneObject,
    render,
)
from jagg_lab.worlds.shapes.tokenizer import Tokenizer
from jagg_lab.worlds.shapes.verifier import Verdict, constraint_checks, verify, verify_batch

__all__ = [
    "BACKGROUND",
    "CATEGORIES",
    "COLORS",
    "DEFAULT_RESOLUTION",
    "MAX_COUNT",
    "PALETTE",
    "RELATIONS",
    "SHAPES",
    "SPLITS",
    "SUPPORTED_RESOLUTIONS",
    "VOCABULARY",
    "Constraints",
    "Detection",
    "ObjectSpec",
    "Scene",
    "SceneObject",
    "ShapesDataset",
    "Tokenizer",
    "Verdict",
    "all_constraints",
    "all_prompts",
    "constraint_checks",
    "detect",
    "detect_batch",
    "parse",
    "relation_holds",
    "render",
    "render_batch",
    "sample_prompt",
    "sample_scene",
    "split_of",
    "to_text",
    "verify",
    "verify_batch",
]
