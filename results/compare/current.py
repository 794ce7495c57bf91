"""The digits tables of today: each encoding from today's code where it was rerun, else the old grid.

``data/<task>.csv`` is the old grid (7ae5ef8 / 7081d13, before issue 19's prefix rule, marked stale);
``data/<task>_today.csv`` holds the reruns at today's code. ``current(task)`` takes, per group
(encoding and varied settings), every run of today's CSV when it has one, and the old grid's runs
otherwise, never mixing the two inside a group; tables built from it label the old grid's rows, so
each row says which code it is from (issue 29 item 1). update.py fills the Markdown blocks with
these tables; the prose around them is written by hand.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's vispe

from vispe import report  # noqa: E402

import freshness  # noqa: E402  (beside this file)

TASKS = ("digits_cell", "digits_relative", "digits_content_position", "digits_class")
MAIN = ("none", "sine", "learned_abs", "sincos2d", "rope_axial", "rope_mixed", "relbias", "peg")
REST = ("learned_rowcol", "axis2d", "normidx2d", "fourier", "relbias_axis", "irpe", "log_cpb")
RESOLUTION = ("learned_abs", "rope_axial", "rope_mixed", "none")
PEGNONE = "peg [padding_mode=none]"
OLD = " (old grid)"  # appended to the label of a row that today's code did not rerun


def load(task: str) -> pd.DataFrame | None:
    f = HERE / "data" / f"{task}.csv"
    return pd.read_csv(f) if f.is_file() else None


def finished(df: pd.DataFrame | None, train_size: bool = True) -> pd.DataFrame | None:
    """The finished runs' rows of ``df`` (at the training size only, by default) with their group; None when
    none finished (a sweep folder of unfinished runs writes a table with no metric yet)."""
    if df is None or "is_train_size" not in df:
        return None
    fin = df[df["status"] == "finished"]
    fin = fin[fin["is_train_size"].astype(bool)] if train_size else fin
    return None if fin.empty else report.add_group(fin)


def _groups(df: pd.DataFrame | None) -> set[str]:
    """The groups with at least one finished run."""
    return set() if df is None else set(report.add_group(df[df["status"] == "finished"])["group"])


def current(task: str) -> tuple[pd.DataFrame | None, set[str]]:
    """Today's runs for every group rerun (one finished run is enough), the old grid's for the rest; and
    the set of old groups kept."""
    old, new = load(task), load(f"{task}_today")
    if new is None or old is None:
        return (new if old is None else old), (set() if old is None else _groups(old))
    rerun = _groups(new)
    og = report.add_group(old)
    kept = old[~og["group"].isin(rerun)]
    return pd.concat([new, kept], ignore_index=True), _groups(kept)


def _labelled(summ: pd.DataFrame, olds: set[str]) -> pd.DataFrame:
    summ = summ.copy()
    summ["group"] = summ["group"].map(lambda g: g + OLD if g in olds else g)
    return summ


def banner(task: str, olds: set[str]) -> str:
    """Which rows are from which code, and why the old ones were not rerun (freshness's verdict on
    each CSV, which also names its commits)."""
    root, marks = HERE.parents[1], freshness.load_marks(HERE.parents[1])
    verdict = lambda name: freshness.judge(root, HERE / "data" / f"{name}.csv", marks)  # noqa: E731
    commits = lambda v: ", ".join(f"`{freshness.short(c)}`" for c in v.commits) or "-"  # noqa: E731
    parts = []
    if (HERE / "data" / f"{task}_today.csv").is_file():
        v = verdict(f"{task}_today")
        parts.append(f"Rows from today's code ({commits(v)}; "
                     + ("fresh by `update.py --check`" if not v.stale else f"{v.state}: {v.mark or 'NOT MARKED'}") + ")")
    if olds:
        v = verdict(task)
        parts.append(f"rows marked *old grid* are from {commits(v)}, before issue 19's prefix rule, "
                     f"not rerun at today's code ({v.state})")
    return "**Code**: " + "; ".join(parts) + ".\n\n"


def progress(df: pd.DataFrame) -> str:
    runs = df.drop_duplicates(["run", "commit"])
    fin = runs[runs["status"] == "finished"]
    hours = fin.get("wall_s", pd.Series(dtype=float)).sum() / 3600
    text = f"{len(fin)} of {len(runs)} started grid points finished ({hours:.1f} h of summed wall time)"
    missing = runs[runs["status"] != "finished"]["run"].tolist()
    return text + (f"; not finished here: {', '.join(missing)}." if missing else ".")


def main_table(task: str, *, today_only: bool = False) -> str:
    df, olds = (load(f"{task}_today"), set()) if today_only else current(task)
    if df is None:
        return "(not run here)"
    summ = report.summarize(df)
    at = summ[summ["is_train_size"].astype(bool)].sort_values("mean", ascending=False)["group"].tolist()
    order = [g for g in at if g in MAIN or g == PEGNONE] + [g for g in at if g not in MAIN and g != PEGNONE]
    table = report.markdown_table(_labelled(summ, olds), "acc", [g + OLD if g in olds else g for g in order])
    return banner(task, olds) + table + "\n\n" + progress(df)


def resolution_table(task: str) -> str:
    """The RoPE-ViT view: accuracy at each size, and the change from the training size."""
    df, olds = current(task)
    if df is None:
        return "(not run here)"
    summ = report.summarize(df)
    summ = summ[summ["group"].isin(RESOLUTION)]
    if summ.empty:
        return "(not run here)"
    order = [g for g in RESOLUTION if g in set(summ["group"])]
    label = lambda g: g + OLD if g in olds else g  # noqa: E731
    table = report.markdown_table(_labelled(summ, olds), "acc", [label(g) for g in order])
    train = summ[summ["is_train_size"].astype(bool)].set_index("group")["mean"]
    sizes = sorted(summ["eval_size"].unique())
    lines = ["| encoding | " + " | ".join(f"Δ @{s}px" for s in sizes) + " |", "|" + "---|" * (len(sizes) + 1)]
    for g in order:
        rows = summ[summ["group"] == g].set_index("eval_size")["mean"]
        lines.append(f"| {label(g)} | " + " | ".join(f"{rows[s] - train[g]:+.3f}" if s in rows else "-" for s in sizes) + " |")
    return (banner(task, olds & set(order)) + table + "\n\nChange from the training size (mean over seeds):\n\n"
            + "\n".join(lines))


def peg_table() -> str:
    """CPVT's padding ablation on every task: peg with zero padding vs without padding."""
    lines = ["| task | PEG zero padding | PEG no padding | difference | none |", "|---|---|---|---|---|"]
    for task in TASKS:
        df, olds = current(task)
        if df is None:
            continue
        summ = report.summarize(df)
        t = summ[summ["is_train_size"].astype(bool)].set_index("group")
        cells = []
        for g in ("peg", PEGNONE, "none"):
            cells.append((report.fmt(t.loc[g, "mean"], t.loc[g, "std"], int(t.loc[g, "n"])) if g in t.index else "-")
                         + (OLD if g in olds else ""))
        diff = f"{t.loc['peg', 'mean'] - t.loc[PEGNONE, 'mean']:+.3f}" if {"peg", PEGNONE} <= set(t.index) else "-"
        lines.append(f"| {task} | {cells[0]} | {cells[1]} | {diff} | {cells[2]} |")
    return "\n".join(lines)


def status_table() -> str:
    """Per task: finished grid points of each part of run_grids.sh's plan, old grid and today's code."""
    lines = ["| task | code | 8 main encodings x 3 seeds | PEG without padding x 3 seeds | rest of the registry x 1 seed "
             "| summed wall time of finished runs |", "|---|---|---|---|---|---|"]
    for task in TASKS:
        for name, code in ((task, "old grid"), (f"{task}_today", "today")):
            df = load(name)
            done = pd.DataFrame(columns=["run"]) if df is None else df[df["status"] == "finished"].drop_duplicates(["run", "commit"])
            fin = set(done["run"])
            main = sum(f"{pe}_seed{s}" in fin for pe in MAIN for s in range(3))
            peg = sum(f"peg+padding_mode-none_seed{s}" in fin for s in range(3))
            rest = sum(f"{pe}_seed0" in fin for pe in REST)
            hours = done.get("wall_s", pd.Series(dtype=float)).sum() / 3600
            lines.append(f"| {task} | {code} | {main} / 24 | {peg} / 3 | {rest} / 7 | {hours:.1f} h |")
    return "\n".join(lines)
