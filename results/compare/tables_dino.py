"""Issue 47's tables (results/compare/detr_dino.md), written from the committed CSVs by update.py.

``dino_table``: DINO and its ablations (data/shapes_dino.csv) beside the deformable rows they are
compared with (data/shapes_deformable_detr.csv) and DAB's anchors in DINO's query formulation (data/shapes_dino.csv); ``epochs_table``: the first evaluated epoch at which
each DINO run's AP reaches the two-stage row's mean (data/shapes_dino_curves.csv); ``short_table``: DINO
at a shorter schedule on one thread, the candidate detection default (data/shapes_dino_short.csv);
``step_ratio``: the step-time ratio that bench/dino_step.py wrote into results/bench_dino_step.md.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from current import load  # beside this file

HERE = Path(__file__).resolve().parent
TWO_STAGE = "sine+decoder_kwargs-with_box_refine_true_two_stage_true"  # in shapes_deformable_detr
REFERENCE_ROWS = [  # (row, run name without _seedN in shapes_deformable_detr)
    ("two-stage Deformable DETR (+ refinement), two threads", TWO_STAGE),
    ("DAB anchors on the deformable decoder, `formulation=\"legacy\"` (before issue 46), two threads", "sine+decoder-dab"),
]
#: DAB's anchors on the deformable operator after issue 46 (DINO's query formulation without its three parts),
#: in shapes_dino: `--vary detr.decoder=dab` with `detr.decoder_kwargs={}`, beside the legacy row
DAB_ROW = ("DAB anchors on the deformable decoder, DINO's query formulation (`detr.decoder=dab`: "
           "no denoising, no query selection, no look-forward-twice)", "sine+decoder-dab", "-")
DINO_ROWS = [  # (row, run name without _seedN in shapes_dino, published COCO AP (R50, 4 scales))
    ("DINO (`detr.decoder=dino`: denoising, mixed query selection, look-forward-twice)", "sine", "12 ep: 49.0"),
    ("DINO without denoising (`dn_number=0`)", "sine+dn_number-0", "-"),
    ("DINO without look-forward-twice", "sine+look_forward_twice-false", "-"),
]
HEADER = ["| design (16 epochs, shapes set) | threads | AP | AP50 | AP per seed | AP at 0.75x / 1.5x | seeds | step "
          "| commit | published (COCO, R50) |", "|---|---|---|---|---|---|---|---|---|---|"]


def _runs(csv: str, run: str) -> pd.DataFrame | None:
    """The finished runs named ``run``_seedN in data/<csv>.csv, every evaluation size; None when none."""
    df = load(csv)
    if df is None:
        return None
    g = df[(df["status"] == "finished") & (df["run"].str.replace(r"_seed\d+$", "", regex=True) == run)]
    return None if g.empty else g


def _train_size(g: pd.DataFrame) -> pd.DataFrame:
    return g[g["is_train_size"].astype(bool)].sort_values("seed")


def dino_table(ap_row: Callable[[str, pd.DataFrame, str], str]) -> str:
    """The rows, each through update.py's ``ap_row`` (the deformable table's cells); missing ones pending."""
    lines = list(HEADER)
    rows = [("shapes_deformable_detr", r, n, "-") for r, n in REFERENCE_ROWS] + [("shapes_dino", *DAB_ROW)] + [
        ("shapes_dino", *r) for r in DINO_ROWS]
    for csv, row, run, paper in rows:
        g = _runs(csv, run)
        lines.append(ap_row(row, g, paper) if g is not None
                     else f"| {row} | - | not finished | - | - | - | 0 | - | - | {paper} |")
    return "\n".join(lines)


def target_ap() -> float | None:
    """The two-stage row's mean AP at the training size (the target of "epochs to reach")."""
    g = _runs("shapes_deformable_detr", TWO_STAGE)
    return None if g is None else float(_train_size(g)["AP"].mean())


def epochs_table() -> str:
    """Per DINO run: AP at every evaluated epoch (training size) and the first epoch at or above the target."""
    target, curves = target_ap(), load("shapes_dino_curves")
    if target is None or curves is None:
        return "(no curves yet)"
    ev = curves.dropna(subset=["test_AP"])
    epochs = sorted(int(e) for e in ev["epoch"].unique())
    lines = ["| run | " + " | ".join(f"AP at epoch {e}" for e in epochs) + f" | first epoch with AP >= {target:.3f} |",
             "|---|" + "---|" * (len(epochs) + 1)]
    for _, run, _ in DINO_ROWS + [DAB_ROW]:
        for name in sorted(n for n in ev["run"].unique() if re.sub(r"_seed\d+$", "", n) == run):
            r = ev[ev["run"] == name].set_index("epoch")["test_AP"]
            cells = [f"{r[e]:.3f}" if e in r.index else "-" for e in epochs]
            hit = [int(e) for e in r.index if r[e] >= target]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {min(hit) if hit else 'not reached'} |")
    two = load("shapes_deformable_detr_curves")
    if two is not None:
        t = two.dropna(subset=["test_AP"])
        t = t[t["run"].str.replace(r"_seed\d+$", "", regex=True) == TWO_STAGE].groupby("epoch")["test_AP"].mean()
        cells = [f"{t[e]:.3f}" if e in t.index else "-" for e in epochs]
        lines.append("| two-stage Deformable DETR, mean of its seeds (two threads) | " + " | ".join(cells) + " | - |")
    return "\n".join(lines)


def short_table() -> str:
    """DINO at a shorter schedule on one thread: AP at the training size, wall time of each run."""
    df = load("shapes_dino_short")
    if df is None:
        return "(no finished run)"
    fin = df[df["status"] == "finished"]
    if fin.empty:
        return "(no finished run yet)"
    lines = ["| run | epochs | threads | AP | AP50 | AP at 0.75x / 1.5x | wall s (whole run) | train s | step | commit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, g in fin.groupby("run", sort=True):
        at = g[g["is_train_size"].astype(bool)].iloc[0]
        scales = " / ".join(f"{g[g['scale'] == s]['AP'].mean():.3f}" for s in (0.75, 1.5))
        thr = re.search(r"(\d+) torch thread", str(at["device"]))
        lines.append(f"| {name} | {int(at['epochs'])} | {thr.group(1) if thr else '-'} | {at['AP']:.3f} | {at['AP50']:.3f} "
                     f"| {scales} | {at['wall_s']:.0f} | {at['train_time_s']:.0f} | {1e3 * at['step_time_s']:.0f} ms "
                     f"| {str(at['commit'])[:7]} |")
    at = fin[fin["is_train_size"].astype(bool)]
    if len(at) > 1:
        lines.append(f"| mean ± std ({len(at)} seeds) | | | {at['AP'].mean():.3f} ± {at['AP'].std():.3f} | "
                     f"{at['AP50'].mean():.3f} ± {at['AP50'].std():.3f} | | {at['wall_s'].mean():.0f} | "
                     f"{at['train_time_s'].mean():.0f} | | |")
    return "\n".join(lines)


def step_ratio() -> str:
    """The DINO / two-stage step-time ratio as results/bench_dino_step.md states it, with its commit."""
    text = (HERE.parents[0] / "bench_dino_step.md").read_text()
    ratio = re.search(r"DINO / two-stage: \*\*([\d.]+)\*\* \(quartiles ([\d.]+-[\d.]+)\)", text)
    commit = re.search(r"Commit (\w+)", text)
    if ratio is None:
        raise ValueError("results/bench_dino_step.md: no 'DINO / two-stage: **R** (quartiles A-B)' line")
    return (f"DINO's training step / two-stage Deformable DETR's: **{ratio.group(1)}** (quartiles {ratio.group(2)}; "
            f"one thread, `bench/dino_step.py`, commit {commit.group(1) if commit else '?'}: "
            "[results/bench_dino_step.md](../bench_dino_step.md))")
