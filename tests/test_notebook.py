"""The padding-leakage notebook runs end to end (tiny scale, VISPE_NB_SMALL=1) without an error.

nbclient starts the kernel named in the notebook's metadata ("python3"). jupyter_client finds that
spec in this interpreter's environment (``<sys.prefix>/share/jupyter/kernels/python3``, shipped by
ipykernel, or ipykernel's built-in spec) and replaces its ``python`` command by ``sys.executable``,
so the kernel is the interpreter running the tests (the project's .venv): nothing to install.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import execute_notebook

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "padding_leakage.ipynb"


@pytest.mark.slow
def test_padding_leakage_notebook_executes(monkeypatch, capfd):
    nb, outputs = execute_notebook(NOTEBOOK, monkeypatch, "import sys; print(sys.executable, SCALE)")
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 5  # targets, maps, 2 bar charts, ViT
    assert sum("text/html" in o.get("data", {}) for o in outputs) >= 3  # the pandas tables
    assert nb.cells[-1].outputs[0]["text"].split() == [sys.executable, "tiny"]
    # issue 41, item 4: progress, in the cells and on the kernel's terminal (what `jupyter execute` shows)
    lines = "".join(o.get("text", "") for o in outputs if o.output_type == "stream").splitlines()
    progress = [line for line in lines if re.match(r"\[\d+/\d+\] ", line)]
    starts = [i for i, line in enumerate(progress) if line.startswith("[1/")]
    assert len(starts) == 2 and all(" SPC " in line for line in progress)  # the CNN sweep, then the ViTs'
    for part in (progress[:starts[1]], progress[starts[1]:]):
        n = int(part[0].split("/")[1].split("]")[0])
        assert [line.split("]")[0] for line in part] == [f"[{k}/{n}" for k in range(1, n + 1)]
    terminal = capfd.readouterr().err
    assert all(line in terminal for line in progress)


def test_the_docs_and_the_notebook_say_how_to_run_it():
    """issue 41, item 4: no command to run the notebook was documented, VISPE_NB_SMALL=1 only inside it."""
    import shutil

    import nbformat

    readme = (NOTEBOOK.parents[1] / "docs" / "guides" / "probes.md").read_text()
    intro = nbformat.read(NOTEBOOK, as_version=4).cells[0].source
    for text in (readme, intro):
        assert "python -m jupyter execute --inplace notebooks/padding_leakage.ipynb" in text
        assert "VISPE_NB_SMALL=1" in text and "about 10 min" in text
    assert shutil.which("jupyter-execute", path=str(Path(sys.executable).parent)) or \
        __import__("importlib").util.find_spec("nbclient.cli")  # `python -m jupyter execute` is nbclient's
