"""The padding-leakage notebook runs end to end (tiny scale, VISPE_NB_SMALL=1) without an error.

nbclient starts the kernel named in the notebook's metadata ("python3"). jupyter_client finds that
spec in this interpreter's environment (``<sys.prefix>/share/jupyter/kernels/python3``, shipped by
ipykernel, or ipykernel's built-in spec) and replaces its ``python`` command by ``sys.executable``,
so the kernel is the interpreter running the tests (the project's .venv): nothing to install.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "padding_leakage.ipynb"


@pytest.mark.slow
def test_padding_leakage_notebook_executes(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("VISPE_NB_SMALL", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable, SCALE)"))
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 5  # targets, maps, 2 bar charts, ViT
    assert sum("text/html" in o.get("data", {}) for o in outputs) >= 3  # the pandas tables
    assert nb.cells[-1].outputs[0]["text"].split() == [sys.executable, "tiny"]
