"""GRPO training of text-to-image flow-matching models with JAGG (Jacobian-Aggregated Group Gradient)."""
from pathlib import Path

__all__ = ["CONF_DIR"]

# The Hydra config groups. One copy, conf/ at the top of the checkout: a source or editable install
# reads it there; a wheel carries it as jagg_lab/conf (setup.py maps it), found first.
_PACKAGE = Path(__file__).resolve().parent
CONF_DIR = str(next((d for d in (_PACKAGE / "conf", _PACKAGE.parent / "conf") if d.is_dir()), _PACKAGE / "conf"))
