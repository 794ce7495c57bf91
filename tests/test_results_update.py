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


def test_update_merges_unfinished_sweeps_and_writes_pending_rows(tmp_path, monkeypatch, capsys):
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
    for name in ("shapes_detr", "relbias_init_vit", "digits_cell_today"):  # no finished run: no CSV, named on stderr
        assert not (here / "data" / f"{name}.csv").exists(), name
        assert f"{name}: 2 run(s) not finished left out of data/{name}.csv: sine_seed0 (not started), sine_seed1 (not " \
               "started)" in capsys.readouterr().err if name == "shapes_detr" else True


def finished_run(folder: Path, seed: int = 0) -> None:
    """A finished sine run of digits_cell (train.py's files: summary.json, <pe>/summary.json, <pe>/metrics.csv)."""
    run = folder / f"sine_seed{seed}"
    (run / "sine").mkdir(parents=True)
    (run / "point.json").write_text(json.dumps({"pe": "sine", "seed": seed, "commit": "abc1234"}))
    (run / "summary.json").write_text(json.dumps({"finished": True, "runtime_s": 12.5}))
    (run / "sine" / "summary.json").write_text(json.dumps({
        "primary": "acc", "task": "classification", "data": "digits_cell", "model": "vit_pico", "train_img_size": 32,
        "eval": {"32": {"acc": 0.5, "loss": 1.25, "scale": 1.0}, "48": {"acc": 0.25, "loss": 2.5, "scale": 1.5}},
        "params": 1000, "epochs": 2, "steps": 100, "threads": 1, "date": "2026-11-28", "device": "cpu"}))
    (run / "sine" / "metrics.csv").write_text("epoch,step,test_acc,img_per_s\n1,50,0.375,209.0\n2,100,0.5,210.5\n")


def test_update_writes_finished_runs_only_and_integers_as_integers(tmp_path, monkeypatch, capsys):
    """A sweep of one finished and one unfinished run: the merged CSV holds the finished run's rows only (the other
    named on stderr), its evaluation size, steps, seed, ... as integers (``32``, not ``32.0``: the unfinished run's
    empty cells made them floats), also where the committed CSV had them as floats; the curves' epochs too."""
    here = tmp_path / "repo" / "results" / "compare"
    (here / "data").mkdir(parents=True)
    monkeypatch.setattr(update, "HERE", here)
    monkeypatch.setattr(current, "HERE", here)
    today = tmp_path / "today"
    unfinished_sweep(today / "digits_cell", runs=2)
    finished_run(today / "digits_cell", seed=0)  # seed 0 finished, seed 1 not started
    # committed before: an old run whose folder is gone, with the floats the old update.py wrote
    (here / "data" / "digits_cell_today.csv").write_text(
        "run,status,encoding,seed,eval_size,is_train_size,acc,steps,commit\n"
        "none_seed0,finished,none,0.0,32.0,True,0.125,100.0,old1234\nnone_seed1,not started,none,1.0,,,,,old1234\n")
    (here / "data" / "digits_cell_today_curves.csv").write_text("epoch,step,test_acc,run,group\n1.0,50.0,0.1,none_seed0,none\n")
    assert update.main(["--sweeps", str(tmp_path / "none"), "--today", str(today)]) == 0
    assert ("digits_cell_today: 2 run(s) not finished left out of data/digits_cell_today.csv: none_seed1 (not started), "
            "sine_seed1 (not started)") in capsys.readouterr().err
    text = (here / "data" / "digits_cell_today.csv").read_text().splitlines()
    df = pd.read_csv(here / "data" / "digits_cell_today.csv")
    assert df["run"].tolist() == ["none_seed0", "sine_seed0", "sine_seed0"] and set(df["status"]) == {"finished"}
    head = text[0].split(",")
    cells = [dict(zip(head, line.split(","))) for line in text[1:]]
    assert [(c["seed"], c["eval_size"], c["steps"]) for c in cells] == [("0", "32", "100"), ("0", "32", "100"),
                                                                        ("0", "48", "100")]
    assert [c["train_size"] for c in cells] == ["", "32", "32"] and [c["acc"] for c in cells] == ["0.125", "0.5", "0.25"]
    assert [c["scale"] for c in cells] == ["", "1.0", "1.5"]  # a float column stays float
    curves = (here / "data" / "digits_cell_today_curves.csv").read_text().splitlines()
    assert curves[0].split(",")[:2] == ["epoch", "step"]
    assert [line.split(",")[:2] for line in curves[1:]] == [["1", "50"], ["1", "50"], ["2", "100"]]
    assert "209.0" in curves[2]  # img_per_s: a float that happens to be whole stays a float
    sweep = pd.read_csv(today / "digits_cell" / "results.csv", dtype=str, keep_default_na=False)  # the sweep's own table
    assert sweep["eval_size"].tolist() == ["32", "48", ""] and sweep["steps"].tolist() == ["100", "100", ""]
