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

from conftest import execute_notebook

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "padding_leakage.ipynb"


@pytest.mark.slow
def test_padding_leakage_notebook_executes(monkeypatch):
    nb, outputs = execute_notebook(NOTEBOOK, monkeypatch, "import sys; print(sys.executable, SCALE)")
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 5  # targets, maps, 2 bar charts, ViT
    assert sum("text/html" in o.get("data", {}) for o in outputs) >= 3  # the pandas tables
    assert nb.cells[-1].outputs[0]["text"].split() == [sys.executable, "tiny"]
