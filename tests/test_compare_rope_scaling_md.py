"""results/compare/rope_scaling.md holds the tables that run_rope_scaling.py builds from today's CSVs."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_compare_script, md_block

HERE = Path(__file__).resolve().parents[1] / "results" / "compare"


@pytest.fixture(scope="module")
def rs():
    return load_compare_script("run_rope_scaling")


@pytest.mark.parametrize("block", ["scaling:digits_cell", "centring"])
def test_rope_scaling_md_holds_today_s_tables(rs, block):
    got = md_block(HERE / "rope_scaling.md", block)
    assert got is not None, f"rope_scaling.md lost its {block} block"
    want = rs.centring_table() if block == "centring" else rs.scaling_table(block.split(":")[1])
    assert got == want, "run .venv/bin/python results/compare/run_rope_scaling.py --report"


def test_centring_table_compares_defaults_only(rs):
    """The uncentred rows of today's code are sine_seed0-2 exactly: no temperature or padding arm pooled in."""
    import pandas as pd

    df = pd.read_csv(HERE / "data" / "digits_content_position_today.csv")
    want = df[df.run.isin([f"sine_seed{k}" for k in range(3)]) & (df.eval_size == 32)].value
    assert len(want) == 3 and len(df[df.run.str.startswith("sine+") & (df.eval_size == 32)]) > 0
    rows = [r for r in rs.centring_table().splitlines() if r.startswith("| sine |") and "c56e0b9" in r]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2] == "3" and cells[5] == rs._cell(want), rows[0]
