"""Every results CSV row says where it came from (issue 53): commit, device, threads, torch version and date.

    .venv/bin/python results/compare/provenance.py            # list what each CSV lacks
    .venv/bin/python results/compare/provenance.py --write    # fill it in where the history gives it

New runs record all five (``train.py``'s summary.json: ``device``, ``threads``, ``torch``, ``date``;
``vispe.sweep.collect`` adds the sweep's ``commit``). Rows written before that are filled here, never invented:

- ``threads``: read from the row's device string (``"..., 2 torch threads"``, ``"1 torch thread(s)"``);
- ``date``: the run's own date where it was recorded (``date_from`` = ``run``), else the day the row first appears
  in the repository's history of the CSV (``date_from`` = ``committed``: the run happened on or before it);
- what only a page or a commit says (``KNOWN``): each value with where it comes from;
- otherwise ``unknown (<why>)``.
"""
from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIRED = ("commit", "device", "threads", "torch", "date")
ID_COLUMNS = ("run", "task", "data", "backbone", "encoding", "variant", "pe_kwargs", "padding", "input", "target",
              "level", "seed", "eval_size", "height", "width", "scale", "config", "epochs", "commit")
THREADS = re.compile(r"(\d+) torch thread")
COMMITTED = "committed"  # date_from: the first commit holding the row (the run's own date was not recorded)

# Values that only a page or a commit records, for CSVs written without them: {csv: {column: value}}.
KNOWN = {
    "results/compare/data/detr_backbones.csv": {  # results/compare/detr_backbones.md, "Machine" and "Commands"
        "device": "AMD EPYC, 2 cores, 1 torch threads", "torch": "2.14.1"},
    "results/padding_leakage.csv": {  # results/padding_leakage.md, "Command" (the runner's --threads 2)
        "device": "AMD EPYC, 2 cores, 2 torch threads", "torch": "2.14.1"},
}
# The commit of rows that name none, where the history says it: padding_leakage.csv came into the repository in
# 485e7b0 together with the probe code that wrote it (run from that tree before it was committed).
KNOWN_COMMIT_OF = {"results/padding_leakage.csv": "485e7b0"}
# CSVs copied out of the history: their rows' first commit is the one they were copied from.
COPIED_FROM = {"results/compare/data/digits_content_position_centred_at_9430049.csv":
               ("results/compare/data/digits_content_position_centred.csv", "9430049")}


def csvs(root: Path = ROOT) -> list[Path]:
    """Every results CSV (per-epoch ``_curves.csv`` files go with their table and are left out)."""
    return [f for f in sorted((root / "results").rglob("*.csv")) if not f.stem.endswith("_curves")]


def missing(df: pd.DataFrame) -> list[str]:
    """The REQUIRED columns ``df`` lacks, or that are empty in some row."""
    return [c for c in REQUIRED if c not in df.columns or df[c].isna().any() or (df[c].astype(str) == "").any()]


def threads_of(device) -> str:
    m = THREADS.search(str(device))
    return m.group(1) if m else "unknown (the device string names no thread count)"


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def first_dates(root: Path, rel: str, df: pd.DataFrame) -> pd.Series:
    """For each row of ``df`` (the CSV ``rel`` as it is now), the day of the first commit whose version of the CSV
    holds the row (matched on the identifying columns both versions have); NaN for a row in no commit."""
    out = pd.Series([None] * len(df), index=df.index, dtype=object)
    now = df.fillna("").astype(str)
    source, upto = COPIED_FROM.get(rel, (rel, "HEAD"))
    for line in _git(root, "log", "--reverse", "--format=%H %cs", upto, "--", source).splitlines():
        commit, day = line.split()
        try:
            then = pd.read_csv(io.StringIO(_git(root, "show", f"{commit}:{source}")), dtype=str, keep_default_na=False)
        except (subprocess.CalledProcessError, pd.errors.EmptyDataError):
            continue
        cols = [c for c in ID_COLUMNS if c in then.columns and c in df.columns]
        if not cols:
            continue
        seen = set(map(tuple, then[cols].to_numpy()))
        todo = out.isna()
        hit = [tuple(r) in seen for r in now.loc[todo, cols].to_numpy()]
        out[todo[todo].index[hit]] = day
    return out


def fill(root: Path, path: Path) -> pd.DataFrame:
    """``path``'s rows with the REQUIRED columns filled where the device strings, KNOWN and git give them."""
    rel = path.relative_to(root).as_posix()
    df = pd.read_csv(path, dtype=str, keep_default_na=False).replace("", None)  # text kept as written
    known = dict(KNOWN.get(rel, {}))
    if rel in KNOWN_COMMIT_OF:
        known["commit"] = _git(root, "rev-parse", KNOWN_COMMIT_OF[rel]).strip()
    for col, value in known.items():
        if col not in df.columns or df[col].isna().all():
            df[col] = value
    if "threads" not in df.columns or df["threads"].isna().any():
        from_device = df["device"].map(threads_of) if "device" in df.columns else "unknown (no device recorded)"
        df["threads"] = df["threads"].fillna(from_device) if "threads" in df.columns else from_device
    if "date" not in df.columns or df["date"].isna().any():
        dates = first_dates(root, rel, df)
        df["date_from"] = df["date_from"].where(df.get("date").notna(), COMMITTED) if "date_from" in df else COMMITTED
        df["date"] = df["date"].fillna(dates) if "date" in df.columns else dates
        df["date"] = df["date"].fillna("unknown (not committed yet)")
    for col in REQUIRED:
        if col not in df.columns:
            df[col] = "unknown (neither the rows nor their pages record it)"
    return df


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="fill the missing columns in place")
    args = p.parse_args(argv)
    rc = 0
    for path in csvs(ROOT):
        lacks = missing(pd.read_csv(path))
        if not lacks:
            continue
        print(f"{path.relative_to(ROOT)}: lacks {', '.join(lacks)}")
        if args.write:
            fill(ROOT, path).to_csv(path, index=False)
        else:
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
