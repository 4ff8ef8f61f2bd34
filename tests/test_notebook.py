"""notebooks/analysis.ipynb runs headless, start to end, on tiny training logs."""
from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from tests.test_experiments import make_tiny_runs
from tests.test_train_cli import REPO

NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    return make_tiny_runs(tmp_path_factory)


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "JAGG_RUNS" in code[0].source


def test_notebook_executes_on_tiny_runs(tiny_runs, monkeypatch):
    monkeypatch.setenv("JAGG_RUNS", str(tiny_runs))  # the kernel inherits the environment
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "4 runs under" in text and "no jagg_routed runs" not in text
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(figures) >= 3  # reward curves, time breakdown, routing
