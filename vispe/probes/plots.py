"""Figures of the padding-leakage experiment (matplotlib, object API: no pyplot state, any backend;
``fig.savefig`` writes PNG through Agg).

* ``plot_predictions``: target maps in the first row, each labelled prediction below, SPC in titles.
* ``plot_bars``: mean SPC or MAE over targets as grouped bars (one panel per input kind).
* ``plot_levels``: a metric against the backbone level (ViT block), one line per encoding.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure

from vispe import _checks
from vispe.probes import metrics


def plot_predictions(targets: torch.Tensor, preds: dict, names, images: dict | None = None,
                     cell: float = 1.6) -> Figure:
    """Target maps (T, h, w) in the first row, then one row per ``preds`` {label: (T, h, w)}.

    ``images`` {label: (3, H, W)} adds a first column with the input each row was predicted from.
    Titles give each prediction's SPC against its target.
    """
    names, images = list(names), dict(images or {})
    if targets.dim() != 3 or targets.shape[0] != len(names):
        raise ValueError(f"targets has shape {tuple(targets.shape)}: expected ({len(names)}, h, w), one per name")
    rows = [("target", targets)] + list(preds.items())
    lead = 1 if images else 0
    fig = Figure(figsize=(cell * (len(names) + lead), cell * len(rows) + 0.3), layout="constrained")
    axes = fig.subplots(len(rows), len(names) + lead, squeeze=False)
    for r, (label, maps) in enumerate(rows):
        if tuple(maps.shape) != tuple(targets.shape):
            raise ValueError(f"preds[{label!r}] has shape {tuple(maps.shape)}: expected {tuple(targets.shape)}")
        if lead:
            ax = axes[r, 0]
            if label in images:
                ax.imshow(images[label].permute(1, 2, 0).clamp(0, 1).cpu().numpy())
                ax.set_title("input", fontsize=8)
            ax.set_axis_off()
        for c, name in enumerate(names):
            ax = axes[r, c + lead]
            ax.imshow(maps[c].detach().float().cpu().numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks([]), ax.set_yticks([])
            if r == 0:
                ax.set_title(name, fontsize=9)
            else:
                rho = float(metrics.spc(maps[c], targets[c])[0])
                ax.set_title(f"SPC {rho:+.2f}", fontsize=8)
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
    return fig


def plot_bars(df: pd.DataFrame, metric: str = "spc", x: str = "padding", hue: str = "backbone",
              panel: str = "input", height: float = 2.6) -> Figure:
    """Mean ``metric`` over the other columns, bars grouped by ``x`` and coloured by ``hue``."""
    _checks.choice("metric", metric, ("spc", "mae"))
    for col in (x, hue, panel):
        if col not in df.columns:
            raise ValueError(f"column {col!r} is not in the table: expected one of {', '.join(df.columns)}")
    panels = list(dict.fromkeys(df[panel]))
    fig = Figure(figsize=(3.6 * len(panels), height), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True, squeeze=False)[0])
    xs, hues = list(dict.fromkeys(df[x])), list(dict.fromkeys(df[hue]))
    width = 0.8 / len(hues)
    for ax, p in zip(axes, panels):
        means = df[df[panel] == p].groupby([x, hue])[metric].mean()
        for j, h in enumerate(hues):
            vals = [means.get((v, h), np.nan) for v in xs]
            ax.bar(np.arange(len(xs)) + (j - (len(hues) - 1) / 2) * width, vals, width, label=str(h))
        ax.set_xticks(np.arange(len(xs)), [str(v) for v in xs], rotation=30, fontsize=8)
        ax.set_title(f"{panel} = {p}", fontsize=9)
        ax.axhline(0, color="black", linewidth=0.6)
    axes[0].set_ylabel(metric.upper())
    axes[-1].legend(fontsize=7)
    return fig


def plot_levels(df: pd.DataFrame, metric: str = "spc", line: str = "encoding_label", panel: str = "input",
                height: float = 2.6) -> Figure:
    """``metric`` (mean over targets) against ``level`` (ViT block), one line per ``line`` value.

    ``line="encoding_label"`` joins the encoding and its padding ("peg:zeros"), made on the fly.
    """
    _checks.choice("metric", metric, ("spc", "mae"))
    df = df.assign(encoding_label=df["encoding"] + np.where(df["padding"] == "-", "", ":" + df["padding"]))
    df = df[df["level"] != "all"].assign(level=lambda d: d["level"].astype(int))
    panels = list(dict.fromkeys(df[panel]))
    fig = Figure(figsize=(3.6 * len(panels), height), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True, squeeze=False)[0])
    for ax, p in zip(axes, panels):
        means = df[df[panel] == p].groupby([line, "level"], sort=False)[metric].mean()
        for label in dict.fromkeys(df[line]):
            if label in means.index.get_level_values(0):
                s = means.loc[label].sort_index()
                ax.plot(s.index, s.values, marker="o", label=str(label))
        ax.set_xticks(sorted(set(df["level"])))
        ax.set_xlabel("block")
        ax.set_title(f"{panel} = {p}", fontsize=9)
        ax.axhline(0, color="black", linewidth=0.6)
    axes[0].set_ylabel(metric.upper())
    axes[-1].legend(fontsize=7)
    return fig
