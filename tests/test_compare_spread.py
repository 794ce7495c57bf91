"""results/compare/spread.py: the seeds' spread is read from both grids, only over encodings with three
finished seeds, and reproducibility.md holds the tables that the committed CSVs give today."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import md_block

HERE = Path(__file__).resolve().parents[1] / "results" / "compare"
sys.path.insert(0, str(HERE))
import spread  # noqa: E402


def write(folder: Path, name: str, rows: list[tuple[str, float, str]]) -> None:
    """rows: (run, acc at the training size, status); one off-size row per run that must be ignored."""
    recs = []
    for run, acc, status in rows:
        recs.append({"run": run, "acc": acc, "status": status, "is_train_size": True})
        recs.append({"run": run, "acc": 0.0, "status": status, "is_train_size": False})
    pd.DataFrame(recs).to_csv(folder / f"{name}.csv", index=False)


def test_seed_spread_reads_both_grids_and_only_three_seed_groups(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.setattr(spread, "HERE", tmp_path)
    monkeypatch.setattr(spread, "TASKS", ("t",))
    write(tmp_path / "data", "t", [("a_seed0", 0.5, "finished"), ("a_seed1", 0.7, "finished"),
                                   ("a_seed2", 0.9, "finished"), ("b_seed0", 0.1, "finished"),
                                   ("b_seed1", 0.1, "finished"), ("b_seed2", 0.1, "finished"),
                                   ("c_seed0", 0.0, "finished"), ("c_seed1", 1.0, "finished")])
    write(tmp_path / "data", "t_today", [("a_seed0", 0.6, "finished"), ("a_seed1", 0.6, "finished"),
                                         ("a_seed2", 0.0, "running")])
    lines = spread.seed_spread().splitlines()[2:]
    assert len(lines) == 1, "today's grid has no group with three finished seeds, so it gets no row"
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[:4] == ["t", "old grid (AMD EPYC)", "2", "0.100"]  # median of std 0.2 (a) and 0 (b); c has 2
    assert cells[4] == "0.200 (a)" and cells[5] == "0.200"


@pytest.mark.parametrize("name", ["seed_spread", "reruns", "machines"])
def test_reproducibility_md_holds_today_s_tables(name):
    block = md_block(HERE / "reproducibility.md", f"spread:{name}")
    assert block is not None, f"reproducibility.md lost its spread:{name} block"
    assert block == getattr(spread, name)(), "run .venv/bin/python results/compare/update.py"
