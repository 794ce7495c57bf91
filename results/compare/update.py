"""Refresh results/compare from the sweep folders: CSV copies, figures and the tables in the .md files.

    .venv/bin/python results/compare/update.py [--sweeps runs/sweeps]

For each task with a sweep folder it writes the sweep's report (vispe.report), merges its tidy
``results.csv`` into ``results/compare/data/<task>.csv`` (vispe.sweep.collect.merge_tables: runs
committed from folders that are gone stay; only finished runs' rows, integers as integers: tidy.py), the per-epoch metrics of its finished runs into
``data/<task>_curves.csv``, draws the merged metric-vs-size plot into ``figures/``, then rewrites
every block ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` of the Markdown files here from those
CSVs (the prose around the blocks is written by hand).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's vispe
sys.path.insert(0, str(HERE))

from vispe import report  # noqa: E402
from vispe.sweep import trace  # noqa: E402
from vispe.sweep.collect import merge_tables  # noqa: E402

import freshness  # noqa: E402  (results/compare/freshness.py, beside this file)
import tidy  # noqa: E402  (beside this file: finished runs only, integers as integers)
from blocks import BLOCKS, SWEEPS  # noqa: E402  (beside this file: what this script merges and writes)
from current import TASKS, load  # noqa: E402  (beside this file)


STATUS = re.compile(r"(<!-- BEGIN freshness:([\w.-]+) -->\n)(?:.*?\n)?(<!-- END freshness:\2 -->)", re.S)


def status_block(name: str) -> str:
    """The status of ``data/<name>.csv`` (or ``results/<name>.csv``), for the page that shows its rows."""
    root = HERE.parents[1]
    csv = next((p for p in (HERE / "data" / f"{name}.csv", root / "results" / f"{name}.csv") if p.is_file()), None)
    if csv is None:
        raise ValueError(f"freshness block {name!r}: no CSV data/{name}.csv or results/{name}.csv")
    return freshness.status_line(freshness.judge(root, csv, freshness.load_marks(root)))


def render(text: str) -> str:
    """``text`` with every block this script writes regenerated from the committed CSVs and marks."""
    for name, fn in BLOCKS.items():
        pat = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n)(?:.*?\n)?(<!-- END {re.escape(name)} -->)", re.S)
        if pat.search(text):
            text = pat.sub(lambda m: m.group(1) + fn() + "\n" + m.group(2), text)
    return STATUS.sub(lambda m: m.group(1) + status_block(m.group(2)) + "\n" + m.group(3), text)


PAGES = ("results/compare/*.md", "results/*.md", "docs/results.md", "README.md")


def pages() -> list[Path]:
    """Every page whose blocks this script writes."""
    root = HERE.parents[1]
    return sorted({p for g in PAGES for p in root.glob(g)})


def fill(md: Path) -> None:
    text = md.read_text()
    new = render(text)
    if new != text:
        md.write_text(new)


def write_code(task: str, sweep: Path, fresh: pd.DataFrame, df: pd.DataFrame) -> None:
    """data/<task>_code.json: per commit of the merged table, the files its runs used and their hashes (the runs'
    imports.json, vispe.sweep.trace), so that freshness.py judges those rows by them; null: not traced."""
    f = HERE / "data" / f"{task}_code.json"
    code = trace.merge(json.loads(f.read_text()) if f.is_file() else {}, trace.by_commit(sweep, fresh))
    code = {c: v for c, v in sorted(code.items()) if c in set(df["commit"].dropna().astype(str))}
    if any(v is not None for v in code.values()):
        f.write_text(json.dumps(code, indent=1, sort_keys=True) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", default=str(HERE.parents[1] / "runs" / "sweeps"))
    p.add_argument("--today", default=str(HERE.parents[1] / "runs" / "sweeps_today"),
                   help="sweeps rerun at today's code: merged into data/<task>_today.csv, beside the old table")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a results CSV is stale (code changed since its runs) and unmarked, or its mark expired")
    p.add_argument("--mark", metavar="CSV", help="mark CSV in results/stale.json: --reason and --evidence, or --record")
    p.add_argument("--reason", default="", help="with --mark: why the table was not rerun")
    p.add_argument("--evidence", default="", help="with --mark: what shows the rows still hold at this checkout")
    p.add_argument("--record", action="store_true", help="with --mark: keep the rows as the record of their commit")
    p.add_argument("--note", nargs=2, metavar=("CSV", "TEXT"), help="say why CSV stays STALE (what differs, from "
                   "which commit): shown by --check and on the pages, it covers nothing")
    p.add_argument("--remark", metavar="NAME", help="re-mark data/NAME.csv from its smoke runs (remark.py)")
    p.add_argument("--against", default=None, help="with --remark: the commit to compare against")
    p.add_argument("--pages", action="store_true", help="only rewrite the pages' blocks (no sweep folders read)")
    args = p.parse_args(argv)
    if args.check:
        text, rc = freshness.report(freshness.check())
        print(text)
        return rc
    if args.mark:
        print(freshness.mark(args.mark, args.reason, evidence=args.evidence, record=args.record))
        return 0
    if args.note:
        print(freshness.note(*args.note))
        return 0
    if args.remark:
        import remark  # noqa: PLC0415  (beside this file; runs training, so only loaded here)

        return remark.remark(args.remark, args.against)
    if args.pages:
        for md in pages():
            fill(md)
        return 0
    (HERE / "data").mkdir(exist_ok=True)
    (HERE / "figures").mkdir(exist_ok=True)
    for task, sweep in [(t, Path(args.sweeps) / t) for t in SWEEPS] + [(f"{t}_today", Path(args.today) / t) for t in TASKS]:
        if not (sweep / "sweep.json").is_file():
            continue
        report.write_report(sweep)  # the sweep folder's own report of the runs there
        fresh, csv = pd.read_csv(sweep / "results.csv"), HERE / "data" / f"{task}.csv"
        ints = tidy.integer_columns(tidy.read_table(sweep / "results.csv"), tidy.read_table(csv) if csv.is_file() else None)
        df = tidy.finished_only(merge_tables(load(task), fresh), task)  # committed runs whose folders are gone stay
        if df.empty:
            print(f"{task}: no finished run: data/{task}.csv not written", file=sys.stderr)
            continue
        tidy.keep_integers(df, ints).to_csv(csv, index=False)
        write_code(task, sweep, fresh, df)
        curves, hist = HERE / "data" / f"{task}_curves.csv", report.histories(sweep, fresh)
        old = tidy.read_table(curves) if curves.is_file() else pd.DataFrame(columns=["run"])
        kept = set(df["run"]) - set(hist["run"] if len(hist) else [])
        parts = [p for p in (old[old["run"].isin(kept)], hist) if len(p)]  # an empty frame would make its ints floats
        if parts:
            hist = pd.concat(parts, ignore_index=True)
            tidy.keep_integers(hist, tidy.integer_columns(*parts)).to_csv(curves, index=False)
        summ = report.summarize(df)
        if not summ.empty:
            fig = report.plot_vs_size(summ, str(df["metric"].iloc[0]))
            fig.savefig(HERE / "figures" / f"{task}_vs_size.png", dpi=110)
            plt.close(fig)
    for md in pages():
        fill(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
