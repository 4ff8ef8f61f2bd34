"""The scripts of experiments/ as modules, for tests that call their functions in-process."""
from __future__ import annotations

import importlib.util
import sys

from tests.test_train_cli import REPO


def load_script(name: str, monkeypatch):
    """experiments/NAME.py imported as module NAME, undone with `monkeypatch` at the test's end:
    registered in sys.modules (its dataclasses look themselves up there) with experiments/ on
    sys.path (the scripts import their siblings, e.g. `from default_gain import ...`)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(REPO / "experiments"))
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module
