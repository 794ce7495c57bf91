"""Every results CSV row records commit, device, threads, torch version and date (issue 53), and new runs write
them: train.py's summary, vispe.sweep.collect's results.csv, vispe.report's report.md, the probe runner's CSV."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from vispe import report
from vispe.sweep import collect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "results" / "compare"))
import provenance  # noqa: E402  (results/compare/provenance.py)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_report import make_run  # noqa: E402  (a run folder as vispe.sweep + train.py leave it)

UNKNOWN = re.compile(r"^unknown \(.+\)$")  # an honest gap says why


@pytest.mark.parametrize("csv", provenance.csvs(ROOT), ids=lambda p: p.name)
def test_every_results_csv_row_records_commit_device_threads_torch_and_date(csv):
    df = pd.read_csv(csv, dtype=str, keep_default_na=False)
    assert provenance.missing(df.replace("", None)) == [], csv.name
    for row in df.itertuples():
        assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", row.commit) or UNKNOWN.match(row.commit), row.commit
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row.date) or UNKNOWN.match(row.date), row.date
        assert row.torch.startswith("2.") or UNKNOWN.match(row.torch), row.torch
        named = provenance.THREADS.search(row.device)  # the thread count the device string names, if any
        assert row.threads == (named.group(1) if named else row.threads) and (row.threads.isdigit() or UNKNOWN.match(
            row.threads)), (row.device, row.threads)
    if "date_from" in df:
        assert set(df["date_from"]) <= {"run", provenance.COMMITTED}


def test_threads_are_read_from_the_device_string_or_said_unknown():
    assert provenance.threads_of("AMD EPYC, 2 cores, 1 torch threads") == "1"
    assert provenance.threads_of("AMD EPYC, 2 cores, 2 torch thread(s)") == "2"
    assert UNKNOWN.match(provenance.threads_of("NVIDIA H100 (CUDA 13.0)"))


def test_the_provenance_check_names_what_a_csv_lacks():
    df = pd.DataFrame({"commit": ["abc"], "device": ["cpu, 2 cores, 1 torch threads"], "torch": ["2.14.1"],
                       "threads": [None]})
    assert provenance.missing(df) == ["threads", "date"]


def test_a_new_runs_rows_and_report_carry_commit_device_threads_torch_and_date(tmp_path):
    sweep = tmp_path / "sw"
    run = make_run(sweep, "sine", 0, {32: 0.9, 48: 0.5}, device="cpu x, 2 cores, 3 torch threads")
    summ = json.loads((run / "sine" / "summary.json").read_text())
    summ.update(torch="2.14.1", threads=3, date="2026-11-28")
    (run / "sine" / "summary.json").write_text(json.dumps(summ))
    make_run(sweep, "none", 0, {32: 0.2, 48: 0.1}, device="cpu x, 2 cores, 1 torch threads")  # written before issue 53
    df = collect.collect(sweep).set_index("run")
    assert df.loc["sine_seed0", "threads"].tolist() == [3, 3] and df.loc["sine_seed0", "date"].tolist() == ["2026-11-28"] * 2
    assert df.loc["sine_seed0", "date_from"].tolist() == ["run"] * 2 and df.loc["sine_seed0", "commit"].iloc[0] == "abc"
    assert df.loc["none_seed0", "threads"].tolist() == [1, 1]  # read from its device string
    assert df.loc["none_seed0", "date"].isna().all()  # not recorded: not invented
    text = report.write_report(sweep).read_text()
    assert ("Provenance of the rows (results.csv): commit abc; device cpu x, 2 cores, 1 torch threads, cpu x, 2 cores, "
            "3 torch threads; threads 1, 3; torch -, 2.14.1; date -, 2026-11-28.") in text


def test_train_py_summary_records_threads_and_date(tmp_path):
    """A tiny real run: the summary train.py writes names torch's threads and the day, beside device and torch
    (the source of the columns above)."""
    import time

    from conftest import load_train_main

    args = ["--smoke", f"train.out_dir={tmp_path}", "train.run_name=p", "train.progress=false", "train.compare=[]",
            "model.embed_dim=16", "model.num_heads=2", "model.depth=1", "train.eval_sizes=[1.0]"]
    assert load_train_main()(args) == 0
    summ = json.loads(next(tmp_path.glob("p/*/summary.json")).read_text())
    assert summ["threads"] == torch.get_num_threads() and summ["torch"] == torch.__version__
    assert summ["device"].endswith(f"{summ['threads']} torch threads")
    assert summ["date"] == time.strftime("%Y-%m-%d", time.gmtime())


def test_the_probe_runners_rows_record_where_they_came_from(tmp_path):
    from vispe.probes import runner

    got = runner.provenance()
    assert got["threads"] == torch.get_num_threads() and got["torch"] == torch.__version__
    assert got["device"].endswith(f"{torch.get_num_threads()} torch threads")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", got["date"]) and got["date_from"] == "run" and got["commit"]
