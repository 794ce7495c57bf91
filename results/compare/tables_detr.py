"""The DETR pages' tables (detr_table3.md, detr_deformable.md), written from the committed CSVs by update.py.

``detr_table``: DETR's Table 3 rows (data/shapes_detr.csv); ``queries_table``: the positioned-query designs
(data/shapes_detr_queries.csv); ``init_relation_table``: issue 35's initialisation and relation rows;
``deformable_table``: issue 36's deformable designs beside the single-scale rows; ``_ap_row``: one row of
AP cells, also used by tables_dino / tables_realtime.
"""
from __future__ import annotations

import re

import pandas as pd
from vispe import report

from current import finished, load  # beside this file

DETR_ROWS = [  # (DETR Table 3 row, group label in the sweep's report, published AP / AP50)
    ("none / none (queries learned at input)", "none [query_pos_at=input]", "32.8 / 55.2"),
    ("sine at input / sine at input", "sine [pe_at=input, query_pos_at=input]", "39.2 / 60.0"),
    ("learned at attn. / learned at attn.", "learned_rowcol", "39.6 / 60.7"),
    ("none / sine at attn.", "sine [pe_at={encoder: none, decoder: attn, queries: attn}]", "39.3 / 60.3"),
    ("sine at attn. / sine at attn. (default)", "sine", "40.6 / 61.6"),
    ("sine at attn. / sine at attn., queries learned at input (not in DETR)", "sine [query_pos_at=input]", "-"),
]


def _key(group: str) -> tuple:
    """A group label as (encoding, sorted settings), so that the order of the varied keys does not matter."""
    name, _, rest = group.partition(" [")
    parts, depth, cur = [], 0, ""
    for ch in rest.rstrip("]"):
        depth += (ch in "{[") - (ch in "}]")
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return (name, tuple(sorted(p for p in parts + [cur.strip()] if p)))


def detr_table() -> str:
    df = load("shapes_detr")
    lines = ["| spatial pos. enc. (encoder / decoder) | here: AP | here: AP50 | seeds | DETR R50 AP / AP50 (published) |",
             "|---|---|---|---|---|"]
    fin = finished(df)
    for row, group, paper in DETR_ROWS:
        g = None if fin is None else fin[fin["group"].map(_key) == _key(group)]
        if g is None or g.empty:
            lines.append(f"| {row} | pending | pending | 0 | {paper} |")
            continue
        cell = lambda c: report.fmt(g[c].mean(), g[c].std(), len(g))  # noqa: E731
        lines.append(f"| {row} | {cell('AP')} | {cell('AP50')} | {len(g)} | {paper} |")
    return "\n".join(lines)


QUERY_ROWS = [  # (design, group label in shapes_detr_queries' report, published COCO AP of the design)
    ("Conditional DETR (sine)", "sine [decoder=conditional]", "R50 50 ep: 40.9 (DETR 50 ep: 34.8)"),
    ("DAB-DETR (sine, w/h-modulated)", "sine [decoder=dab, temperature=20.0]", "R50 50 ep: 42.2"),
    ("DAB-DETR + BoxRPB", "sine [decoder=dab, temperature=20.0, box_bias=boxrpb]", "Plain-DETR, Swin-v2-S 12 ep: 37.2 -> 46.1 with BoxRPB"),
]


def queries_table() -> str:
    """The positioned-query rows beside DETR's default placement (same budget, shapes set)."""
    lines = ["| query design (encoder: sine at attn.) | here: AP | here: AP50 | seeds | commit | published (COCO) |",
             "|---|---|---|---|---|---|"]
    base = load("shapes_detr")
    rows = [("DETR (learned query positions at attn., the default row above)", base, "sine", "R50 50 ep: 34.8")]
    rows += [(r, load("shapes_detr_queries"), g, p) for r, g, p in QUERY_ROWS]
    for row, df, group, paper in rows:
        fin = finished(df)
        g = None if fin is None else fin[fin["group"].map(_key) == _key(group)]
        if g is None or g.empty:
            lines.append(f"| {row} | pending | pending | 0 | - | {paper} |")
            continue
        cell = lambda c: report.fmt(g[c].mean(), g[c].std(), len(g))  # noqa: E731
        commits = ", ".join(sorted({str(c)[:7] for c in g.get("commit", pd.Series(dtype=str)).dropna()})) or "-"
        lines.append(f"| {row} | {cell('AP')} | {cell('AP50')} | {len(g)} | {commits} | {paper} |")
    return "\n".join(lines)


INIT_ROWS = [  # (row, CSV, group label in its report): configs/shapes_detr_table3.yaml's DAB-DETR + BoxRPB
    ("DAB-DETR + BoxRPB, the papers' initialisation (`detr.init=papers`, the default)", "shapes_detr_init",
     "sine [init=papers]"),
    ("DAB-DETR + BoxRPB, vispe's before issue 35 (`detr.init=legacy`)", "shapes_detr_init", "sine [init=legacy]"),
    ("DAB-DETR + BoxRPB + Relation-DETR's relation (`detr.query_relation=relation`, papers' init)", "shapes_detr_init",
     "sine [query_relation=relation]"),
    ("DAB-DETR + BoxRPB, the papers' initialisation", "shapes_detr_init_1thread", "sine"),  # one arm: no vary in its label
    ("DAB-DETR + BoxRPB, vispe's before issue 35 (Table 3's row above; `41af1fa` repeats its seed 0 bit for bit)",
     "shapes_detr_queries", "sine [decoder=dab, temperature=20.0, box_bias=boxrpb]"),
]


def _threads(runs: pd.DataFrame) -> str:
    """The torch threads the runs trained with, read from their device column ("..., 2 torch threads")."""
    found = sorted({m.group(1) for d in runs.get("device", pd.Series(dtype=str)).dropna()
                    if (m := re.search(r"(\d+) torch thread", str(d)))})
    return ", ".join(found) or "-"


def init_relation_table() -> str:
    """Issue 35's rows: AP at the training size (mean +- std, and each seed), at 0.75x and 1.5x, and the
    torch threads of the runs (a run's numbers depend on them: another reduction order)."""
    lines = ["| design (configs/shapes_detr_table3.yaml, 16 epochs) | threads | AP | AP50 | AP per seed (0, 1, 2) "
             "| AP at 0.75x / 1.5x | seeds | commit |", "|---|---|---|---|---|---|---|---|"]
    for row, csv, group in INIT_ROWS:
        g = _group_runs(csv, group)
        if g is None:
            lines.append(f"| {row} | - | pending | pending | - | - | 0 | - |")
            continue
        threads, ap, ap50, seeds, sizes, n, _, commits = _ap_cells(g)
        lines.append(f"| {row} | {threads} | {ap} | {ap50} | {seeds} | {sizes} | {n} | {commits} |")
    return "\n".join(lines)


SINGLE_SCALE_ROWS = [  # (row, CSV, group label): configs/shapes_detr_table3.yaml's single-scale designs at the same budget
    ("single-scale DAB-DETR + BoxRPB (configs/shapes_detr_table3.yaml, vispe's init before issue 35)", "shapes_detr_queries",
     "sine [decoder=dab, temperature=20.0, box_bias=boxrpb]"),
    ("single-scale DAB-DETR + BoxRPB, the papers' initialisation (issue 35)", "shapes_detr_init", "sine [init=papers]"),
    ("single-scale DAB-DETR + BoxRPB, the papers' initialisation (issue 35)", "shapes_detr_init_1thread", "sine"),
    ("single-scale DAB-DETR (no box bias)", "shapes_detr_queries", "sine [decoder=dab, temperature=20.0]"),
]
DEFORMABLE_ROWS = [  # (row, run name without _seedN in shapes_deformable_detr, published COCO AP (R50))
    ("Deformable DETR (`detr.decoder=deformable`)", "sine+decoder-deformable", "50 ep: 44.5"),
    ("Deformable DETR + box refinement", "sine+decoder_kwargs-with_box_refine_true", "50 ep: 46.2"),
    ("two-stage Deformable DETR (+ refinement)", "sine+decoder_kwargs-with_box_refine_true_two_stage_true",
     "50 ep: 46.9"),
    ("DAB anchors on the deformable decoder (`detr.decoder=dab`, `formulation=\"legacy\"` semantics: before issue 46)", "sine+decoder-dab",
     "DINO 12 ep: 49.0 (with its denoising and mixed query selection)"),
    ("Deformable DETR, no level embedding", "sine+decoder-deformable+level_pe-none", "-"),
    ("+ box refinement, no level embedding", "sine+decoder_kwargs-with_box_refine_true+level_pe-none", "-"),
    ("two-stage, no level embedding", "sine+decoder_kwargs-with_box_refine_true_two_stage_true+level_pe-none", "-"),
    ("DAB anchors, no level embedding", "sine+decoder-dab+level_pe-none", "-"),
]


def _group_runs(csv: str, group: str) -> pd.DataFrame | None:
    """The finished runs of ``group`` (a report label) in the committed ``csv``, every size; None when none."""
    fin = finished(load(csv), train_size=False)
    g = None if fin is None else fin[fin["group"].map(_key) == _key(group)]
    return None if g is None or g.empty else g


def _ap_cells(sizes: pd.DataFrame) -> tuple[str, ...]:
    """A row's cells from its runs' rows at every evaluation size (``sizes``; those at the training size
    give the rest): threads, AP, AP50 (mean +- std), AP per seed, AP at 0.75x / 1.5x, seeds, mean step
    time, commits."""
    at = sizes[sizes["is_train_size"].astype(bool)].sort_values("seed")
    cell = lambda c: report.fmt(at[c].mean(), at[c].std(), len(at))  # noqa: E731
    seeds = " / ".join(f"{v:.3f}" for v in at["AP"])
    scales = " / ".join(f"{sizes[sizes['scale'] == s]['AP'].mean():.3f}" for s in (0.75, 1.5))
    commits = ", ".join(sorted({str(c)[:7] for c in at["commit"].dropna()})) or "-"
    step = f"{1e3 * at['step_time_s'].mean():.0f} ms" if "step_time_s" in at else "-"
    return _threads(at), cell("AP"), cell("AP50"), seeds, scales, str(len(at)), step, commits


def _ap_row(row: str, sizes: pd.DataFrame, paper: str) -> str:
    return "| " + " | ".join((row, *_ap_cells(sizes), paper)) + " |"


def deformable_table() -> str:
    """Issue 36's rows: the deformable designs at configs/shapes_detr_table3.yaml's budget, beside the single-scale
    rows; the runs' torch threads, AP at the training size (mean +- std, each seed), at 0.75x / 1.5x, mean step
    time of the runs."""
    lines = ["| design (16 epochs, shapes set) | threads | AP | AP50 | AP per seed | AP at 0.75x / 1.5x | seeds | step "
             "| commit | published (COCO, R50) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row, name, group in SINGLE_SCALE_ROWS:
        g = _group_runs(name, group)
        if g is None:
            lines.append(f"| {row} | - | pending | pending | - | - | 0 | - | - | - |")
            continue
        lines.append(_ap_row(row, g, "-"))
    df = load("shapes_deformable_detr")
    for row, run, paper in DEFORMABLE_ROWS:
        g = None if df is None else df[(df["status"] == "finished") & (df["run"].str.replace(r"_seed\d+$", "", regex=True)
                                                                         == run)]
        if g is None or g.empty:
            lines.append(f"| {row} | - | pending | pending | - | - | 0 | - | - | {paper} |")
            continue
        lines.append(_ap_row(row, g, paper))
    return "\n".join(lines)
