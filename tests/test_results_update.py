"""results/compare/update.py on sweep folders that hold only unfinished runs (a sweep just started, or
stopped before its first run finished): the tables merge, the pages' blocks say "pending" / "not run",
nothing raises (it raised KeyError 'is_train_size' before: the folder's table had no metric columns)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "results" / "compare"))
import current  # noqa: E402
import update  # noqa: E402

from vispe.sweep.collect import COLUMNS, collect  # noqa: E402

BLOCKS = ("detr", "detr_queries", "detr_init", "detr_deformable", "relbias_init", "readme_caption")


def unfinished_sweep(folder: Path, runs: int = 2) -> Path:
    """A sweep folder whose runs have a point.json and nothing else (not started)."""
    for i in range(runs):
        (folder / f"sine_seed{i}").mkdir(parents=True)
        (folder / f"sine_seed{i}" / "point.json").write_text(json.dumps({"pe": "sine", "seed": i, "commit": "abc1234"}))
    (folder / "sweep.json").write_text("{}")
    return folder


def test_the_table_of_unfinished_runs_has_every_column(tmp_path):
    df = collect(unfinished_sweep(tmp_path / "s"), write=False)
    assert set(COLUMNS) <= set(df.columns)
    assert df["status"].tolist() == ["not started"] * 2 and df["is_train_size"].isna().all()


def test_update_merges_unfinished_sweeps_and_writes_pending_rows(tmp_path, monkeypatch):
    here = tmp_path / "repo" / "results" / "compare"
    (here / "data").mkdir(parents=True)
    monkeypatch.setattr(update, "HERE", here)
    monkeypatch.setattr(current, "HERE", here)
    sweeps, today = tmp_path / "sweeps", tmp_path / "today"
    for name in ("shapes_detr", "shapes_detr_queries", "shapes_detr_init", "shapes_deformable_detr", "relbias_init_vit"):
        unfinished_sweep(sweeps / name)
    unfinished_sweep(today / "digits_cell")
    page = here / "page.md"
    page.write_text("".join(f"<!-- BEGIN {b} -->\n<!-- END {b} -->\n" for b in BLOCKS))
    assert update.main(["--sweeps", str(sweeps), "--today", str(today)]) == 0
    text = page.read_text()
    assert "| sine at attn. / sine at attn. (default) | pending | pending | 0 | 40.6 / 61.6 |" in text
    assert "| Conditional DETR (sine) | pending | pending | 0 | - |" in text
    assert "| Deformable DETR (`detr.decoder=deformable`) | - | pending |" in text
    assert text.count("| not run | | | | | |") == 2  # relbias_init_vit unfinished, relbias_init_torch absent
    assert "no finished runs in data/digits_cell_today.csv" in text
    for name in ("shapes_detr", "relbias_init_vit", "digits_cell_today"):
        df = pd.read_csv(here / "data" / f"{name}.csv")
        assert set(COLUMNS) <= set(df.columns) and df["run"].tolist() == ["sine_seed0", "sine_seed1"], name
