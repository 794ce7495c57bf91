"""Issue 49's tables (results/compare/detr_vit.md), written from the committed CSVs by update.py.

``vit_table``: the RF-DETR-style detector on the shapes set (data/shapes_rfdetr.csv, run_rfdetr.sh) trained at
native aspect with padding masks, on square-resized images, and at native aspect with ``rope_mixed`` in place
of the DINOv2-style table; every row evaluated at native aspect. ``paired_table``: native minus square per seed
(the same seed: the same initialisation and data order). ``step_ratio``: the step-time ratio against
transformers that bench/vit_detr_step.py wrote into results/bench_vit_detr_step.md.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from current import load  # beside this file

HERE = Path(__file__).resolve().parent
CSV = "shapes_rfdetr"
ROWS = [  # (row, run name without _seedN)
    ("native aspect, padding masks (`configs/shapes_rfdetr.yaml`)", "learned_abs"),
    ("square-resized training (`configs/shapes_rfdetr_square.yaml`), evaluated at native aspect",
     "learned_abs+train_augment-square"),
    ("native aspect, `rope_mixed` in place of the DINOv2-style table (`model.pe=rope_mixed`)", "rope_mixed"),
]


def _runs(run: str) -> pd.DataFrame | None:
    """The finished runs named ``run``_seedN at their training size (native aspect), by seed; None when none."""
    df = load(CSV)
    if df is None:
        return None
    g = df[(df["status"] == "finished") & (df["run"].str.replace(r"_seed\d+$", "", regex=True) == run)
           & df["is_train_size"].astype(bool)]
    return None if g.empty else g.sort_values("seed")


def _fmt(s: pd.Series) -> str:
    return f"{s.mean():.3f} ± {s.std():.3f}" if len(s) > 1 else f"{s.iloc[0]:.3f}"


def vit_table() -> str:
    """One row per variant: AP, AP50, AP75 (mean ± std over seeds), AP per seed, seeds, step, wall, commits."""
    lines = ["| RF-DETR-style detector (16 epochs, shapes set, one thread) | AP | AP50 | AP75 | AP per seed "
             "| seeds | step | wall s (mean) | commit |", "|---|---|---|---|---|---|---|---|---|"]
    for row, run in ROWS:
        g = _runs(run)
        if g is None:
            lines.append(f"| {row} | not finished | - | - | - | 0 | - | - | - |")
            continue
        seeds = ", ".join(f"seed {int(k)}: {a:.3f}" for k, a in zip(g["seed"], g["AP"]))
        commits = ", ".join(sorted({str(c)[:7] + ("+dirty" if str(c).endswith("+dirty") else "")
                                    for c in g["commit"].dropna()}))
        lines.append(f"| {row} | {_fmt(g['AP'])} | {_fmt(g['AP50'])} | {_fmt(g['AP75'])} | {seeds} | {len(g)} "
                     f"| {1e3 * g['step_time_s'].mean():.0f} ms | {g['wall_s'].mean():.0f} | {commits} |")
    return "\n".join(lines)


def paired_table() -> str:
    """Per seed run in both rows: AP native, AP square, native - square; and the same for rope_mixed - table."""
    pairs = [("native - square", ROWS[0][1], ROWS[1][1]), ("rope_mixed - table (native)", ROWS[2][1], ROWS[0][1])]
    lines = ["| difference | seed | AP (first) | AP (second) | first - second |", "|---|---|---|---|---|"]
    for name, a, b in pairs:
        ga, gb = _runs(a), _runs(b)
        if ga is None or gb is None:
            lines.append(f"| {name} | - | - | - | not both finished |")
            continue
        both = ga.set_index("seed")["AP"].to_frame("a").join(gb.set_index("seed")["AP"].to_frame("b"), how="inner")
        for seed, r in both.iterrows():
            lines.append(f"| {name} | {int(seed)} | {r['a']:.3f} | {r['b']:.3f} | {r['a'] - r['b']:+.3f} |")
        if len(both) > 1:
            d = both["a"] - both["b"]
            lines.append(f"| {name} | mean ± std ({len(both)} seeds) | | | {d.mean():+.3f} ± {d.std():.3f} |")
    return "\n".join(lines)


def step_ratio() -> str:
    """vispe's / transformers' training step as results/bench_vit_detr_step.md states it, with its commit."""
    path = HERE.parents[0] / "bench_vit_detr_step.md"
    if not path.is_file():
        return "(results/bench_vit_detr_step.md not written yet)"
    text = path.read_text()
    ratio = re.search(r"vispe / transformers: \*\*([\d.]+)\*\* \(quartiles ([\d.]+-[\d.]+)\)", text)
    commit = re.search(r"Commit (\w+)", text)
    if ratio is None:
        raise ValueError("results/bench_vit_detr_step.md: no 'vispe / transformers: **R** (quartiles A-B)' line")
    return (f"vispe's training step / transformers' `RfDetrForObjectDetection`'s at the same config: **{ratio.group(1)}** "
            f"(quartiles {ratio.group(2)}; one thread, `bench/vit_detr_step.py`, commit "
            f"{commit.group(1) if commit else '?'}: [results/bench_vit_detr_step.md](../bench_vit_detr_step.md))")
