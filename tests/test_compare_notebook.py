"""notebooks/compare_encodings.ipynb runs end to end from committed files (VISPE_NB_SMALL=1).

The kernel is the interpreter running the tests (see tests/test_notebook.py); PYTHONPATH points it
at this checkout, so the notebook draws with the vispe under test.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import execute_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "compare_encodings.ipynb"


@pytest.mark.slow
def test_compare_encodings_notebook_executes(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb, outputs = execute_notebook(NOTEBOOK, monkeypatch, "import sys, vispe; print(sys.executable, SCALE, vispe.__file__)")
    for cell in nb.cells:  # the notebook defines nothing: plotting calls only
        assert cell.cell_type == "markdown" or not any(line.startswith(("def ", "class ")) for line in cell.source.splitlines())
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 12
    assert sum("text/markdown" in o.get("data", {}) for o in outputs) >= 1  # the tables
    exe, scale, path = nb.cells[-1].outputs[0]["text"].split()
    assert exe == sys.executable and scale == "tiny" and Path(path).resolve().is_relative_to(ROOT)
