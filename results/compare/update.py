"""Refresh results/compare from the sweep folders: CSV copies, figures and the tables in the .md files.

    .venv/bin/python results/compare/update.py [--sweeps runs/sweeps]

For each task with a sweep folder it writes the sweep's report (vispe.report), copies its tidy
``results.csv`` to ``results/compare/data/<task>.csv`` and its metric-vs-size plot to
``figures/``, then rewrites every block ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` of the
Markdown files here from those CSVs (the prose around the blocks is written by hand).
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's vispe

from vispe import report  # noqa: E402

TASKS = ("digits_cell", "digits_relative", "digits_content_position", "digits_class")
MAIN = ("none", "sine", "learned_abs", "sincos2d", "rope_axial", "rope_mixed", "relbias", "peg")
RESOLUTION = ("learned_abs", "rope_axial", "rope_mixed", "none")
CHANCE = {"digits_cell": 1 / 9, "digits_relative": 1 / 4, "digits_content_position": 1 / 20, "digits_class": 1 / 10}


def load(task: str) -> pd.DataFrame | None:
    f = HERE / "data" / f"{task}.csv"
    return pd.read_csv(f) if f.is_file() else None


def main_table(task: str) -> str:
    df = load(task)
    if df is None:
        return "(not run here)"
    summ = report.summarize(df)
    main = [g for g in summ["group"].unique() if g in MAIN]
    rest = [g for g in summ["group"].unique() if g not in MAIN]
    order = lambda gs: list(summ[summ["is_train_size"] & summ["group"].isin(gs)].sort_values("mean", ascending=False)["group"])  # noqa: E731
    return report.markdown_table(summ, "acc", order(main) + order(rest)) + "\n\n" + progress(df)


def progress(df: pd.DataFrame) -> str:
    runs = df.drop_duplicates("run")
    fin = runs[runs["status"] == "finished"]
    hours = fin["wall_s"].sum() / 3600
    text = f"{len(fin)} of {len(runs)} started grid points finished ({hours:.1f} h of wall time on the shared CPU)"
    missing = runs[runs["status"] != "finished"]["run"].tolist()
    return text + (f"; not finished here: {', '.join(missing)}." if missing else ".")


def resolution_table(task: str) -> str:
    """The RoPE-ViT view: accuracy at each size, and the change from the training size."""
    df = load(task)
    if df is None:
        return "(not run here)"
    summ = report.summarize(df)
    summ = summ[summ["group"].isin(RESOLUTION)]
    if summ.empty:
        return "(not run here)"
    order = [g for g in RESOLUTION if g in set(summ["group"])]
    table = report.markdown_table(summ, "acc", order)
    train = summ[summ["is_train_size"]].set_index("group")["mean"]
    sizes = sorted(summ["eval_size"].unique())
    lines = ["| encoding | " + " | ".join(f"Δ @{s}px" for s in sizes) + " |", "|" + "---|" * (len(sizes) + 1)]
    for g in order:
        rows = summ[summ["group"] == g].set_index("eval_size")["mean"]
        lines.append(f"| {g} | " + " | ".join(f"{rows[s] - train[g]:+.3f}" if s in rows else "-" for s in sizes) + " |")
    return table + "\n\nChange from the training size (mean over seeds):\n\n" + "\n".join(lines)


def peg_table() -> str:
    """CPVT's padding ablation on every task: peg with zero padding vs without padding."""
    lines = ["| task | PEG zero padding | PEG no padding | difference | none |", "|---|---|---|---|---|"]
    for task in TASKS:
        df = load(task)
        if df is None:
            continue
        summ = report.summarize(df)
        t = summ[summ["is_train_size"]].set_index("group")
        cells = []
        for g in ("peg", "peg [padding_mode=none]", "none"):
            cells.append(report.fmt(t.loc[g, "mean"], t.loc[g, "std"], int(t.loc[g, "n"])) if g in t.index else "-")
        diff = (f"{t.loc['peg', 'mean'] - t.loc['peg [padding_mode=none]', 'mean']:+.3f}"
                if {"peg", "peg [padding_mode=none]"} <= set(t.index) else "-")
        lines.append(f"| {task} | {cells[0]} | {cells[1]} | {diff} | {cells[2]} |")
    return "\n".join(lines)


def redgreen_table() -> str:
    f = HERE / "data" / "redgreen.csv"
    if not f.is_file():
        return "(not run here)"
    df = pd.read_csv(f)
    paper = {"valid": "100.0 ± 0.0 / 0.2 ± 0.1", "same_zeros": "99.8 ± 0.1 / 8.4 ± 0.7",
             "same_circular": "73.7 ± 1.0 / 73.7 ± 1.0 (their code: circular padding of 2)",
             "full_zeros": "89.7 ± 0.5 / 89.7 ± 0.5", "full_circular": "(the row above, as their code runs it)"}
    lines = ["| convolution | similar (here) | dissimilar (here) | seeds | published similar / dissimilar |",
             "|---|---|---|---|---|"]
    for ct, g in df.groupby("conv_type", sort=False):
        lines.append(f"| {ct} | {g['similar_acc'].mean():.1f} ± {g['similar_acc'].std():.1f} | "
                     f"{g['dissimilar_acc'].mean():.1f} ± {g['dissimilar_acc'].std():.1f} | {len(g)} | {paper.get(ct, '-')} |")
    return "\n".join(lines)


BLOCKS = {**{f"main:{t}": (lambda t=t: main_table(t)) for t in TASKS},
          **{f"resolution:{t}": (lambda t=t: resolution_table(t)) for t in TASKS},
          "peg": peg_table, "redgreen": redgreen_table}


def fill(md: Path) -> None:
    text = md.read_text()
    for name, fn in BLOCKS.items():
        pat = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n).*?(\n<!-- END {re.escape(name)} -->)", re.S)
        if pat.search(text):
            text = pat.sub(lambda m: m.group(1) + fn() + m.group(2), text)
    md.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", default=str(HERE.parents[1] / "runs" / "sweeps"))
    args = p.parse_args(argv)
    (HERE / "data").mkdir(exist_ok=True)
    (HERE / "figures").mkdir(exist_ok=True)
    for task in TASKS:
        sweep = Path(args.sweeps) / task
        if not (sweep / "sweep.json").is_file():
            continue
        report.write_report(sweep)
        shutil.copy(sweep / "results.csv", HERE / "data" / f"{task}.csv")
        if (sweep / "metric_vs_size.png").is_file():
            shutil.copy(sweep / "metric_vs_size.png", HERE / "figures" / f"{task}_vs_size.png")
    for md in sorted(HERE.glob("*.md")):
        fill(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
