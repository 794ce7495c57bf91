"""The seeds' spread of every task's grid: the unit in which differences between encodings are read.

    .venv/bin/python results/compare/spread.py          # the Markdown tables on stdout

update.py writes the same tables into reproducibility.md's blocks. For each task, in the old grid
(data/<task>.csv) and at today's code (data/<task>_today.csv): over the encodings with 3 seeds, the
standard deviation over seeds of the test accuracy at the training size (median and largest over
encodings); the rerun of one committed run (data/rerun_*.csv) against the run it repeats; and
today's Intel runs against the old grid's AMD runs where the code path did not change.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
TASKS = ("digits_cell", "digits_relative", "digits_content_position", "digits_class")


def _finished_at_train_size(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["is_train_size"].astype(bool) & (df["status"] == "finished")]


def seed_spread() -> str:
    """Per task, the old grid's seeds and today's (data/<task>_today.csv) side by side."""
    lines = ["| task | grid (machine) | encodings with 3 seeds | median std over seeds | largest std (encoding) "
             "| 2 x median std |", "|---|---|---|---|---|---|"]
    for task in TASKS:
        for suffix, label in (("", "old grid (AMD EPYC)"), ("_today", "today's code (mostly Intel Xeon)")):
            f = HERE / "data" / f"{task}{suffix}.csv"
            if not f.is_file():
                continue
            df = pd.read_csv(f)
            t = _finished_at_train_size(df).copy()
            t["group"] = t["run"].str.replace(r"_seed\d+$", "", regex=True)
            g = t.groupby("group")["acc"].agg(["std", "count"])
            g = g[g["count"] >= 3]
            if g.empty:
                continue
            worst = g["std"].idxmax()
            lines.append(f"| {task} | {label} | {len(g)} | {g['std'].median():.3f} | {g.loc[worst, 'std']:.3f} "
                         f"({worst}) | {2 * g['std'].median():.3f} |")
    return "\n".join(lines)


def reruns() -> str:
    lines = ["| rerun file | run | committed (commit) | rerun (commit) | difference |", "|---|---|---|---|---|"]
    for f in sorted((HERE / "data").glob("rerun_*.csv")):
        r = pd.read_csv(f)
        r = r[r["is_train_size"].astype(bool)]
        task = r["data"].iloc[0] if "data" in r and r["data"].iloc[0] in TASKS else next(t for t in TASKS if t in f.stem)
        o = pd.read_csv(HERE / "data" / f"{task}.csv")
        o = o[o["is_train_size"].astype(bool)]
        for _, row in r.iterrows():
            m = o[o["run"] == row["run"]].iloc[0]
            lines.append(f"| {f.name} | {task} {row['run']} | {m['acc']:.3f} ({m['commit'][:7]}) | "
                         f"{row['acc']:.3f} ({row['commit'][:7]}) | {row['acc'] - m['acc']:+.3f} |")
    return "\n".join(lines)


# encodings whose runs the code changes since the old grid left bit-identical on one machine
# (rerun_today.md: digits_relative seed 0 at a159f7d equalled 7ae5ef8 to every logged digit)
UNCHANGED = ("none", "learned_abs", "relbias", "peg", "peg+padding_mode-none")


def machines() -> str:
    """Today's runs on the Intel Xeon against the old grid's on the AMD EPYC, same run, encodings whose
    code path did not change: what changing the machine kind alone does."""
    lines = ["| task | runs compared | nearly equal (test loss within 1e-5) | median abs. acc difference "
             "| largest (run) |", "|---|---|---|---|---|"]
    for task in TASKS:
        f = HERE / "data" / f"{task}_today.csv"
        if not f.is_file():
            continue
        new = _finished_at_train_size(pd.read_csv(f))
        new = new[new["device"].astype(str).str.startswith("Intel")
                  & new["run"].str.replace(r"_seed\d+$", "", regex=True).isin(UNCHANGED)]
        m = new.merge(_finished_at_train_size(pd.read_csv(HERE / "data" / f"{task}.csv")), on="run",
                      suffixes=("", "_old"))
        if m.empty:
            continue
        d = (m["acc"] - m["acc_old"]).abs()
        same = int(((m["loss"] - m["loss_old"]).abs() < 1e-5).sum())
        lines.append(f"| {task} | {len(m)} | {same} | {d.median():.3f} | {d.max():.3f} ({m.loc[d.idxmax(), 'run']}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(seed_spread() + "\n\n" + reruns() + "\n\n" + machines())
