"""The results pages say what update.py says now (issue 53): every generated block, the staleness
statuses included, equals what ``update.py --pages`` would write from the committed CSVs and marks;
every results CSV's status is shown on some page."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "results" / "compare"))
import freshness  # noqa: E402
import update  # noqa: E402

needs_git = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                               reason="needs git and this repository's history")


@needs_git
@pytest.mark.slow
def test_committed_pages_equal_what_update_writes_now():
    stale = [p.relative_to(ROOT).as_posix() for p in update.pages() if update.render(p.read_text()) != p.read_text()]
    assert not stale, (f"{stale}: regenerate with `python results/compare/update.py --pages` (code or data changed "
                       "since they were written; the pages then show what is stale)")


def test_every_results_csv_has_its_status_on_a_page():
    shown = {m for p in update.pages() for m in re.findall(r"<!-- BEGIN freshness:([\w.-]+) -->", p.read_text())}
    csvs = {p.stem for p in freshness.tables(ROOT)}
    assert csvs <= shown, sorted(csvs - shown)


def test_a_status_block_names_an_existing_csv():
    with pytest.raises(ValueError, match="no CSV"):
        update.render("<!-- BEGIN freshness:nope -->\n<!-- END freshness:nope -->\n")


def test_the_registry_of_blocks_is_its_own_module(monkeypatch):
    """results/compare/blocks.py holds what update.py merges and writes (SWEEPS, BLOCKS); update.py renders from it."""
    import blocks

    assert update.BLOCKS is blocks.BLOCKS and update.SWEEPS is blocks.SWEEPS
    assert {"detr", "today_vs_old:digits_cell", "relbias_init", "leakage_vit", "provenance"} <= set(blocks.BLOCKS)
    monkeypatch.setitem(blocks.BLOCKS, "probe:block", lambda: "| written |")
    assert update.render("a\n<!-- BEGIN probe:block -->\nold\n<!-- END probe:block -->\n") == \
        "a\n<!-- BEGIN probe:block -->\n| written |\n<!-- END probe:block -->\n"
