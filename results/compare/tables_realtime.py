"""Issue 48's tables (results/compare/detr_realtime.md), written from the committed CSVs by update.py.

``realtime_table``: RT-DETR (AIFI's sin-cos, mask-aware, and ``rope_mixed`` in its place; data/shapes_rtdetr.csv)
and D-FINE (data/shapes_dfine.csv) on the shapes set at one thread, beside DINO's row (data/shapes_dino.csv);
``sizes_table``: every run's AP at 0.75x / 1x / 1.5x the training size; ``step_ratio``: the step-time ratio
against transformers that bench/rtdetr_step.py measured, as results/bench_rtdetr_step.md states it.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from current import load  # beside this file

HERE = Path(__file__).resolve().parent
#: the sweep folders update.py merges for this page (runs/sweeps/<name>)
SWEEPS = ("shapes_rtdetr", "shapes_dfine")
ROWS = [  # (row, CSV, run name without _seedN, published COCO AP)
    ("DINO (`configs/shapes_dino.yaml`, [detr_dino.md](detr_dino.md))", "shapes_dino", "sine", "R50 12 ep: 49.0"),
    ("RT-DETR, AIFI's sin-cos (`sincos2d`, mask-aware, transformers' layout)", "shapes_rtdetr", "sincos2d", "R50: 53.1"),
    ("RT-DETR, AIFI's encoding `rope_mixed`", "shapes_rtdetr", "rope_mixed", "-"),
    ("D-FINE (`configs/shapes_dfine.yaml`: FDR, LQE, FGL + DDF; AIFI's sin-cos)", "shapes_dfine", "sincos2d", "L: 53.9"),
]
HEADER = ["| design (16 epochs, shapes set) | threads | AP | AP50 | AP per seed | AP at 0.75x / 1.5x | seeds | step "
          "| commit | published (COCO) |", "|---|---|---|---|---|---|---|---|---|---|"]


def _runs(csv: str, run: str) -> pd.DataFrame | None:
    """The finished runs named ``run``_seedN in data/<csv>.csv, every evaluation size; None when none."""
    df = load(csv)
    if df is None:
        return None
    g = df[(df["status"] == "finished") & (df["run"].str.replace(r"_seed\d+$", "", regex=True) == run)]
    return None if g.empty else g


def realtime_table(ap_row: Callable[[str, pd.DataFrame, str], str]) -> str:
    """The rows, each through update.py's ``ap_row`` (the deformable table's cells); missing ones not run."""
    lines = list(HEADER)
    for row, csv, run, paper in ROWS:
        g = _runs(csv, run)
        lines.append(ap_row(row, g, paper) if g is not None
                     else f"| {row} | - | not run | - | - | - | 0 | - | - | {paper} |")
    return "\n".join(lines)


def sizes_table() -> str:
    """Per finished run of this page's CSVs: AP at 0.75x / 1x / 1.5x the training size, train time, commit."""
    lines = ["| design | run | AP at 0.75x | AP at 1x | AP at 1.5x | train s | commit |", "|---|---|---|---|---|---|---|"]
    for design, csv in (("RT-DETR", "shapes_rtdetr"), ("D-FINE", "shapes_dfine")):
        df = load(csv)
        fin = None if df is None else df[df["status"] == "finished"]
        if fin is None or fin.empty:
            lines.append(f"| {design} | (no finished run) | - | - | - | - | - |")
            continue
        for name, g in sorted(fin.groupby("run"), key=lambda kv: (re.sub(r"_seed\d+$", "", kv[0]), kv[0])):
            ap = {round(float(s), 2): v for s, v in zip(g["scale"], g["AP"])}
            at = g[g["is_train_size"].astype(bool)].iloc[0]
            cells = " | ".join(f"{ap[s]:.3f}" if s in ap else "-" for s in (0.75, 1.0, 1.5))
            lines.append(f"| {design} | {name} | {cells} | {at['train_time_s']:.0f} | {str(at['commit'])[:7]} |")
    return "\n".join(lines)


def step_ratio() -> str:
    """vispe / transformers step time of RT-DETR as results/bench_rtdetr_step.md states it, with its commit."""
    path = HERE.parents[0] / "bench_rtdetr_step.md"
    if not path.is_file():
        return "(not measured: results/bench_rtdetr_step.md missing)"
    text = path.read_text()
    wall = re.search(r"vispe / transformers \(wall\): \*\*([\d.]+)\*\* \(quartiles ([\d.]+-[\d.]+)\)", text)
    cpu = re.search(r"vispe / transformers \(cpu\): \*\*([\d.]+)\*\* \(quartiles ([\d.]+-[\d.]+)\)", text)
    commit = re.search(r"Commit (\w+)", text)
    if wall is None or cpu is None:
        raise ValueError("results/bench_rtdetr_step.md: no 'vispe / transformers (wall|cpu): **R** (quartiles A-B)' lines")
    return (f"RT-DETR's training step, vispe / transformers: **{wall.group(1)}** wall (quartiles {wall.group(2)}), "
            f"**{cpu.group(1)}** CPU (quartiles {cpu.group(2)}); one thread, `bench/rtdetr_step.py`, commit "
            f"{commit.group(1) if commit else '?'}: [results/bench_rtdetr_step.md](../bench_rtdetr_step.md)")


#: the paired comparisons of this page: (label, (CSV, run) minus (CSV, run)), seeds paired by number
PAIRS = [
    ("RT-DETR: `rope_mixed` - AIFI's sin-cos", ("shapes_rtdetr", "rope_mixed"), ("shapes_rtdetr", "sincos2d")),
    ("D-FINE - RT-DETR (both AIFI's sin-cos)", ("shapes_dfine", "sincos2d"), ("shapes_rtdetr", "sincos2d")),
]


def _ap_by_seed(csv: str, run: str) -> dict[tuple[int, float], float]:
    """{(seed, scale): AP} of the finished runs ``run``_seedN in data/<csv>.csv."""
    g = _runs(csv, run)
    if g is None:
        return {}
    return {(int(s), round(float(c), 2)): float(a) for s, c, a in zip(g["seed"], g["scale"], g["AP"])}


def _verdict(diffs: list[float]) -> str:
    """'within the seed spread' unless the mean paired difference is over two standard errors from 0."""
    if len(diffs) < 2:
        return "one seed: no verdict"
    s = pd.Series(diffs)
    se = float(s.std()) / len(diffs) ** 0.5
    return "within the seed spread" if abs(float(s.mean())) <= 2 * se else (
        "higher" if float(s.mean()) > 0 else "lower") + " by more than two standard errors"


def _diff_row(label: str, scale: float, d: list[float]) -> str:
    """One row of the paired table: differences ``d`` paired by seed, mean (+- sd), per seed, verdict."""
    sd = f" +- {pd.Series(d).std():.3f}" if len(d) > 1 else ""
    return f"| {label} | {scale}x | {sum(d) / len(d):+.3f}{sd} | {' / '.join(f'{x:+.3f}' for x in d)} | {_verdict(d)} |"


def _paired(a: dict, b: dict, scale: float, base: float) -> list[float]:
    """AP at ``scale`` in ``a`` minus AP at ``base`` in ``b``, over the seeds both have."""
    return [a[s, scale] - b[s, base] for s in sorted(s for s, c in a if c == scale and (s, base) in b)]


def paired_table() -> str:
    """Per pair of rows and evaluation scale: the AP difference paired by seed (mean +- sd, per seed) and
    a verdict; then per design, AP at 0.75x and 1.5x minus AP at 1x (the resolution question)."""
    lines = ["| comparison | scale | mean difference +- sd | per seed | verdict |", "|---|---|---|---|---|"]
    for label, a, b in PAIRS:
        ap_a, ap_b = _ap_by_seed(*a), _ap_by_seed(*b)
        lines += [_diff_row(label, scale, d) for scale in (0.75, 1.0, 1.5) if (d := _paired(ap_a, ap_b, scale, scale))]
    for label, csv, run in (("RT-DETR, sin-cos", "shapes_rtdetr", "sincos2d"),
                            ("RT-DETR, `rope_mixed`", "shapes_rtdetr", "rope_mixed"),
                            ("D-FINE", "shapes_dfine", "sincos2d")):
        ap = _ap_by_seed(csv, run)
        lines += [_diff_row(f"{label}: AP at {scale}x - at 1x", scale, d)
                  for scale in (0.75, 1.5) if (d := _paired(ap, ap, scale, 1.0))]
    return "\n".join(lines)
