"""A merged table as update.py writes it into results/compare/data: the finished runs' rows only, integers as integers.

A sweep folder's ``results.csv`` holds one row without metrics for each run that has not finished (so that its
report can say what is missing); those rows are left out of the committed CSV (the runs are named on stderr:
they are not results). A column of integers (evaluation size, steps, seed, epoch) that has an empty cell on
some row is a float column to pandas, and was written ``16.0``: ``read_table`` reads such a column back as
integers, and ``keep_integers`` writes a column as integers when a source table held it as integers and every
value of it is whole (which also repairs a committed ``16.0`` once a sweep merges its rows again).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

INTEGER = re.compile(r"-?\d+")


def read_table(path: str | Path) -> pd.DataFrame:
    """``path``'s table, a column whose filled cells are all integer literals as integers (``Int64`` where a
    cell is empty, which ``pd.read_csv`` alone reads as floats)."""
    df = pd.read_csv(path)
    text = pd.read_csv(path, dtype=str, keep_default_na=False)
    for c in df.columns:
        cells = text[c][text[c] != ""]
        if pd.api.types.is_float_dtype(df[c]) and len(cells) and cells.str.fullmatch(INTEGER).all():
            df[c] = df[c].astype("Int64")
    return df


def integer_columns(*frames: pd.DataFrame | None) -> set[str]:
    """The columns that some frame of ``frames`` holds as integers (booleans are not integers here)."""
    return {c for df in frames if df is not None for c in df.columns
            if pd.api.types.is_integer_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])}


def keep_integers(df: pd.DataFrame, ints: set[str]) -> pd.DataFrame:
    """``df`` with each column of ``ints`` whose values are all whole numbers as integers (``Int64``: an empty cell
    stays empty); other columns as they are."""
    out = df.copy()
    for c in sorted(ints & set(out.columns)):
        col = out[c]
        if pd.api.types.is_bool_dtype(col) or not pd.api.types.is_numeric_dtype(col):
            continue
        vals = col.dropna().astype(float)
        if len(vals) and (vals == vals.round()).all():
            out[c] = col.astype("Float64").astype("Int64")
    return out


def finished_only(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of ``df``'s finished runs; the runs left out (status other than ``finished``) are named on stderr,
    e.g. ``shapes_detr: 2 runs not finished left out of data/shapes_detr.csv: sine_seed0 (not
    started), sine_seed1 (unfinished)``."""
    if "status" not in df:
        raise ValueError(f"{name}: expected a status column in the merged table, got {list(df.columns)}")
    done = df["status"] == "finished"
    left = df[~done].drop_duplicates("run")
    if len(left):
        runs = ", ".join(f"{r} ({s})" for r, s in zip(left["run"], left["status"]))
        print(f"{name}: {len(left)} run(s) not finished left out of data/{name}.csv: {runs}",
              file=sys.stderr)
    return df[done].reset_index(drop=True)
