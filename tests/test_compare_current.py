"""results/compare/current.py: the digits tables take each encoding from today's reruns when there is a
finished one, else from the old grid, never mixing the two in a group, and label the old rows."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results" / "compare"))
import current  # noqa: E402


def runs(commit: str, rows: list[tuple[str, int, float, str]]) -> pd.DataFrame:
    """One row per run at the training size: (encoding, seed, acc, status)."""
    return pd.DataFrame([{"run": f"{e}_seed{s}", "status": st, "encoding": e, "seed": s, "commit": commit,
                          "eval_size": 32, "is_train_size": True, "value": a, "acc": a, "params": 1.0,
                          "step_time_s": 0.1, "peak_mem_mb": 1.0, "train_time_s": 1.0, "wall_s": 60.0}
                         for e, s, a, st in rows])


@pytest.fixture
def tables(monkeypatch):
    old = runs("a" * 40, [("sine", s, 0.4, "finished") for s in range(3)] + [("rope", s, 0.8, "finished") for s in range(3)]
               + [("peg", s, 0.9, "finished") for s in range(3)])
    new = runs("b" * 40, [("sine", 0, 0.7, "finished"), ("rope", 0, 0.0, "running")])
    data = {"t": old, "t_today": new}
    monkeypatch.setattr(current, "load", lambda name: data.get(name))
    monkeypatch.setattr(current, "banner", lambda task, olds: "")
    return old, new


def test_today_replaces_a_group_whole_and_unfinished_reruns_do_not(tables):
    df, olds = current.current("t")
    sine = df[df["encoding"] == "sine"]
    assert list(sine["acc"]) == [0.7] and set(sine["commit"]) == {"b" * 40}  # no old seed mixed in
    assert olds == {"rope", "peg"}  # rope's rerun has not finished: the old grid's three seeds stay
    assert (df[(df["encoding"] == "rope") & (df["status"] == "finished")]["acc"] == 0.8).all()


def test_the_table_labels_the_old_rows(tables):
    text = current.main_table("t")
    assert "| sine | 1 |" in text and "| rope (old grid) | 3 |" in text and "| peg (old grid) | 3 |" in text
    assert "not finished here: rope_seed0" in text
    only = current.main_table("t", today_only=True)
    assert "old grid" not in only and "| sine | 1 |" in only
