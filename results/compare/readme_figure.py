"""The README's figure and its caption, from ``data/digits_cell_today.csv`` (issue 53: a caption whose figures come
from the CSV, a legend that covers no curve).

    .venv/bin/python results/compare/readme_figure.py          # redraw figures/digits_cell_today_vs_size.png
    .venv/bin/python results/compare/readme_figure.py --all    # redraw every figures/<table>_vs_size.png

Each figure is ``vispe.report.plot_vs_size`` of its committed CSV (what ``update.py`` draws after a sweep, the
sweep folders no longer needed); ``caption()`` is the text of README.md's ``<!-- BEGIN readme_caption -->`` block,
written by ``update.py --pages``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's vispe
sys.path.insert(0, str(HERE))

from current import load  # noqa: E402  (beside this file)

from vispe import report  # noqa: E402

TABLE = "digits_cell_today"
CHANCE = 1 / 9  # digits_cell: which of 9 cells holds the digit
HOLD = 0.95  # "holds": a mean at or above this at every evaluation size


def figure_path(table: str = TABLE) -> Path:
    return HERE / "figures" / f"{table}_vs_size.png"


def draw(table: str = TABLE) -> Path:
    """figures/<table>_vs_size.png from data/<table>.csv."""
    df = load(table)
    if df is None:
        raise FileNotFoundError(f"data/{table}.csv: no such table")
    fig = report.plot_vs_size(report.summarize(df), str(df["metric"].dropna().iloc[0]))
    out = figure_path(table)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def caption(table: str = TABLE) -> str:
    """The README figure's caption, every figure in it from the CSV."""
    df = load(table)
    summ = None if df is None else report.summarize(df)
    if summ is None or summ.empty:  # e.g. a sweep folder of unfinished runs only (its CSV is not written): nothing yet
        return f"*(no finished runs in data/{table}.csv yet: `python results/compare/readme_figure.py` writes this caption)*"
    means = summ.pivot_table(index="group", columns="eval_size", values="mean")
    seeds = summ.groupby("group")["n"].max()
    train = int(summ[summ["is_train_size"].astype(bool)]["eval_size"].iloc[0])
    sizes = sorted(means.columns)
    above = [s for s in sizes if s > train]
    encodings = sorted(df["encoding"].unique())
    main = sorted(g for g in seeds.index if seeds[g] > 1 and "[" not in g)
    hold = [g for g in means.index if (means.loc[g] >= HOLD).all()]
    rope = [means.loc[g, s] for g in ("rope_axial", "rope_mixed") for s in above if s >= 1.5 * train]
    commits = ", ".join(f"`{c[:7]}`" for c in sorted(df["commit"].dropna().unique()))
    cpu = sorted(df["device"].dropna().unique())
    return (
        f"*{len(encodings)} encodings trained at {train} px on `digits_cell` (which cell of a 3x3 grid "
        f"holds a digit) and evaluated at {sizes[0]}-{sizes[-1]} px; {min(seeds[main])} seeds of the {len(main)} main "
        f"encodings, 1 of the rest. {len(hold)} hold at every size ({', '.join(f'`{g}`' for g in hold)}: "
        f"{_span(means.loc[hold].min(axis=1))} at worst); the learned table, resampled, keeps "
        f"{_span(means.loc['learned_abs', above])} above the training size; `rope_axial` and `rope_mixed` fall to {_span(rope)} from {int(1.5 * train)} px on; `none` stays near chance "
        f"({_span(means.loc['none'])}, chance {CHANCE:.2f}). From `bash results/compare/run_grids.sh` on "
        f"{' / '.join(cpu)} at {commits}; drawn by `python results/compare/readme_figure.py`; the tables, machines "
        "and commits: [results/compare/embedded_tasks.md](results/compare/embedded_tasks.md).*"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="every figures/<table>_vs_size.png whose data/<table>.csv exists")
    args = p.parse_args(argv)
    tables = sorted(f.name[: -len("_vs_size.png")] for f in (HERE / "figures").glob("*_vs_size.png")) if args.all \
        else [TABLE]
    for t in tables:
        if (HERE / "data" / f"{t}.csv").is_file():
            print(draw(t).relative_to(HERE.parents[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
