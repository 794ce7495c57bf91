"""The figures in detr_table3.md's prose, written from the CSVs (issue 53: prose that cannot drift from
its data). Each function returns the text of one ``<!-- BEGIN name -->`` block that update.py fills.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def _csv(name: str) -> pd.DataFrame:
    return pd.read_csv(HERE / "data" / f"{name}.csv")


def _at(df: pd.DataFrame, run: str, scale: float = 1.0) -> pd.Series:
    """AP of the seeds of ``run`` (name without ``_seedN``) at ``scale`` of the training size, by seed."""
    rows = df[(df["run"].str.replace(r"_seed\d+$", "", regex=True) == run) & (df["scale"] == scale)]
    return rows.set_index("seed")["AP"].sort_index()


def welch_t(a: pd.Series, b: pd.Series) -> float:
    """Welch's t of mean(a) - mean(b) (sample standard deviations)."""
    return (a.mean() - b.mean()) / math.sqrt(a.var() / len(a) + b.var() / len(b))


def _ms(s: pd.Series) -> str:
    return f"{s.mean():.3f} ± {s.std():.3f}"


def table3_runtime() -> str:
    runs = _csv("shapes_detr").drop_duplicates("run")
    return (f"**Runtime**: {runs['wall_s'].min():.0f}-{runs['wall_s'].max():.0f} s of wall time per run, "
            f"{runs['wall_s'].sum() / 60:.0f} minutes summed over the {len(runs)} runs (two at a time on the two cores).")


SINE_QUERY_ROWS = ("sine+decoder-conditional", "sine+decoder-dab", "sine+decoder-dab+box_bias-boxrpb")


def queries_scale() -> str:
    q = _csv("shapes_detr_queries")
    means = [_at(q, r, 1.5).mean() for r in SINE_QUERY_ROWS]
    return (f"At 1.5x the training size (96 px) the three rows keep {min(means):.3f}-{max(means):.3f} AP (means over "
            "seeds, `data/shapes_detr_queries.csv`).")


def init_reading() -> str:
    two, one, old = _csv("shapes_detr_init"), _csv("shapes_detr_init_1thread"), _csv("shapes_detr_queries")
    p2, l2 = _at(two, "sine+init-papers"), _at(two, "sine+init-legacy")
    p1, l1 = _at(one, "sine+init-papers"), _at(old, "sine+decoder-dab+box_bias-boxrpb")
    above = sum(int(a > b) for a, b in zip(l2, p2))
    return (
        f"At two threads vispe's previous initialisation is above the papers' on {above} of {len(p2)} seeds "
        f"({_ms(l2)} against {_ms(p2)}, Welch t = {welch_t(l2, p2):.1f} with 3 runs against 3); at one thread the two "
        f"are {abs(p1.mean() - l1.mean()):.3f} apart ({_ms(p1)} papers', {_ms(l1)} previous, t = {welch_t(p1, l1):.1f}). "
        "Pooling the six runs of each initialisation over both thread counts would hide exactly this: the data show an "
        "interaction of initialisation and thread count (another reduction order, hence another trajectory) that three "
        "seeds per cell cannot settle, not two initialisations that cannot be told apart. That the thread count moves a run "
        "as much as a seed is shown for one seed only (seed 0 at one thread repeats Table 3's run to the last bit, "
        "`same_numbers.md`, \"threads\")."
    )
