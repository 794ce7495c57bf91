"""The constant-offset measurement of results/compare/constant_offset.md: its split is exact, it
behaves as the note reads it, and the note's tables are what the code gives today."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import load_compare_script, md_block

HERE = Path(__file__).resolve().parents[1] / "results" / "compare"


@pytest.fixture(scope="module")
def co():
    return load_compare_script("constant_offset")


@pytest.mark.parametrize("pe", ["sine", "sincos2d"])
def test_split_is_exact_and_centring_removes_the_constant(co, pe):
    m = co.measure(pe, 8, 10000.0, 64)
    assert math.isclose(m["total"] ** 2, m["constant"] ** 2 + m["varying"] ** 2, rel_tol=1e-5)
    assert m["constant"] > 2 * m["varying"]  # the finding at the digits tasks' grid
    assert m["centred_constant"] < 1e-6


def test_normalised_sine_does_not_depend_on_the_grid_and_index_sincos_does(co):
    sine = [co.measure("sine", n, 10000.0, 64)["constant"] for n in (8, 32)]
    assert abs(sine[0] - sine[1]) < 2e-3
    ratio = [(lambda m: m["constant"] / m["varying"])(co.measure("sincos2d", n, 10000.0, 64)) for n in (8, 32)]
    assert ratio[1] < ratio[0] - 0.5
    low, high = (co.measure("sine", 8, t, 64) for t in (20.0, 10000.0))
    assert low["constant"] < high["constant"] and low["flat"] < high["flat"]


def test_the_note_holds_today_s_tables(co):
    block = md_block(HERE / "constant_offset.md", "constant_offset")
    assert block is not None, "constant_offset.md lost its table block"
    assert block == co.markdown(), "run .venv/bin/python results/compare/update.py"
