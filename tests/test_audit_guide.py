"""docs/guides/audit.md shows the reports that tools/audit_guide.py prints: each case is run here and
its report compared with the guide's block (regenerate with ``python tools/audit_guide.py --write``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("audit_guide", ROOT / "tools" / "audit_guide.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TOOL = load_tool()


def test_the_guide_has_a_block_per_case():
    assert set(TOOL.shown(TOOL.GUIDE.read_text())) == set(TOOL.CASES)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TOOL.CASES))
def test_the_guide_shows_what_the_audit_prints(name):
    assert TOOL.shown(TOOL.GUIDE.read_text())[name] == TOOL.CASES[name](), (
        f"{name}: the guide's report is stale; run python tools/audit_guide.py --write")


def test_the_cases_report_their_defects():
    text = TOOL.shown(TOOL.GUIDE.read_text())
    assert "[windows] 4 of 4 attention windows at 8x16 patches are not rectangles" in text["rf_detr"]
    assert "[sizes] runs at 56x56 px but refuses 4 of 4 other sizes" in text["sam3"]
    assert text["mask2former"].count("computes position in bfloat16 under autocast") == 2
    assert "up to 2 apart" in text["rt_detr_vs_omdet"]
