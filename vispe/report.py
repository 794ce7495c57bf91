"""Report of a sweep folder: mean +- std over seeds per encoding and evaluation size, and plots.

    python -m vispe.report runs/sweeps/digits_cell

reads (and rewrites) ``results.csv`` (vispe.sweep.collect) and writes into the sweep folder:
``report.md`` (tables of the primary metric at the training size and at every evaluation size, with
parameters, step time, peak memory, seeds finished, what is missing, the commands from ``sweep.json``, and
the rows' commit, device, threads, torch version and date), ``metric_vs_size.png`` (metric against evaluation size, error bars = std over
seeds) and ``curves.png`` (test metric against epoch, mean over seeds). A group is one encoding
plus any config key that takes more than one value in the sweep (e.g. ``peg [padding_mode=none]``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd


def group_keys(df: pd.DataFrame) -> list[str]:
    """Dotted config columns (overrides and --vary keys) that take more than one value."""
    return [c for c in df.columns if "." in c and df[c].fillna("-").astype(str).nunique() > 1]


def add_group(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``group`` column: the run's label (the encoding; a detector's design with it,
    e.g. ``sine (dab, boxrpb)``), plus ``[key=value, ...]`` for the other varied keys."""
    from vispe.train.detection import DetectionTask  # the keys its label shows

    df = df.copy()
    keys = group_keys(df)

    def label(row) -> str:
        labelled = pd.notna(row.get("label"))  # runs of older versions have none: the encoding and every key
        extra = [f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in keys
                 if pd.notna(row[k]) and not (labelled and k in DetectionTask.LABEL_KEYS)]
        return str(row["label"] if labelled else row["encoding"]) + (f" [{', '.join(extra)}]" if extra else "")

    df["group"] = df.apply(label, axis=1) if len(df) else pd.Series(dtype=str)
    return df


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (group, eval_size) of finished runs: mean, std (ddof 1; NaN for one seed), n, and
    the run costs (params, mean step time, mean peak memory)."""
    df = add_group(df)
    fin = df[df["status"] == "finished"]
    if fin.empty:
        return pd.DataFrame(columns=["group", "eval_size", "is_train_size", "mean", "std", "n"])
    g = fin.groupby(["group", "eval_size"], sort=False)
    out = g.agg(mean=("value", "mean"), std=("value", "std"), n=("value", "size"),
                is_train_size=("is_train_size", "first"), params=("params", "first"),
                step_time_s=("step_time_s", "mean"), peak_mem_mb=("peak_mem_mb", "mean"),
                train_time_s=("train_time_s", "mean")).reset_index()
    out["eval_size"] = out["eval_size"].astype(int)  # float in the CSV when unfinished runs left NaNs
    return out


def fmt(mean: float, std: float, n: int, digits: int = 3) -> str:
    if pd.isna(mean):
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if n > 1 and pd.notna(std) else f"{mean:.{digits}f} (1 seed)"


def markdown_table(summary: pd.DataFrame, metric: str = "acc", order: list[str] | None = None) -> str:
    """Groups (rows, best at the training size first) x evaluation sizes, plus n and costs."""
    if summary.empty:
        return "(no finished runs)"
    sizes = sorted(summary["eval_size"].unique())
    train = summary[summary["is_train_size"].astype(bool)]
    if order is None:
        order = list(train.sort_values("mean", ascending=False)["group"]) or list(dict.fromkeys(summary["group"]))
    train_size = int(train["eval_size"].iloc[0]) if len(train) else None
    head = ["encoding", "seeds"] + [f"{metric} @{s}px" + (" (train)" if s == train_size else "") for s in sizes]
    head += ["params", "step ms", "peak MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for grp in order:
        rows = summary[summary["group"] == grp].set_index("eval_size")
        if rows.empty:
            continue
        first = rows.iloc[0]
        cells = [grp, str(int(rows["n"].max()))]
        cells += [fmt(rows.loc[s, "mean"], rows.loc[s, "std"], int(rows.loc[s, "n"])) if s in rows.index else "-"
                  for s in sizes]
        cells += [f"{first['params'] / 1e3:.1f}k" if pd.notna(first["params"]) else "-",
                  f"{first['step_time_s'] * 1e3:.0f}" if pd.notna(first["step_time_s"]) else "-",
                  f"{first['peak_mem_mb']:.0f}" if pd.notna(first["peak_mem_mb"]) else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_vs_size(summary: pd.DataFrame, metric: str = "acc", groups: list[str] | None = None, ax=None):
    """Metric against evaluation size per group, error bars = std over seeds; returns the Figure. On a figure of
    its own the legend is outside the axes, right of them, so that it covers no curve."""
    import matplotlib.pyplot as plt

    fig = ax.figure if ax is not None else plt.figure(figsize=(8.4, 4.2), layout="constrained")
    own = ax is None
    ax = ax or fig.add_subplot(111)
    groups = groups or list(dict.fromkeys(summary["group"]))
    for i, grp in enumerate(groups):
        rows = summary[summary["group"] == grp].sort_values("eval_size")
        if rows.empty:
            continue
        ax.errorbar(rows["eval_size"].to_numpy(float), rows["mean"].to_numpy(float),
                    yerr=rows["std"].fillna(0.0).to_numpy(float), marker="os^D"[i // 10 % 4], ms=3,
                    ls=("-", "--", "-.", ":")[i // 10 % 4], capsize=2, label=grp)  # 10 colours: a style per ten
    train = summary[summary["is_train_size"].astype(bool)]
    if len(train):
        ax.axvline(train["eval_size"].iloc[0], color="grey", ls=":", lw=1, label="training size")
    ax.set_xlabel("evaluation size (px)")
    ax.set_ylabel(f"test {metric}")
    ax.grid(alpha=0.3)
    if own:
        fig.legend(loc="outside right upper", fontsize=7, ncol=1 + (len(groups) > 22))
    else:  # the caller's figure and layout
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
    return fig


def histories(sweep_dir: Path, df: pd.DataFrame) -> pd.DataFrame:
    """Per-epoch metrics of every finished run: the rows of each ``<run>/<encoding>/metrics.csv``."""
    df = add_group(df)
    frames = []
    for (run, enc, grp), _ in df[df["status"] == "finished"].groupby(["run", "encoding", "group"], sort=False):
        f = Path(sweep_dir) / run / enc / "metrics.csv"
        if f.is_file():
            frames.append(pd.read_csv(f).assign(run=run, group=grp))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def plot_curves(hist: pd.DataFrame, metric: str = "acc", groups: list[str] | None = None, ax=None):
    """Test metric against epoch, mean over seeds (band = min..max); returns the Figure."""
    import matplotlib.pyplot as plt

    fig = ax.figure if ax is not None else plt.figure(figsize=(6.4, 4.2))
    ax = ax or fig.add_subplot(111)
    col = f"test_{metric}"
    if not hist.empty and col in hist:
        for grp in groups or list(dict.fromkeys(hist["group"])):
            h = hist[hist["group"] == grp].groupby("epoch")[col]
            if not len(h):
                continue
            m = h.mean()
            x = m.index.to_numpy(float)
            (line,) = ax.plot(x, m.to_numpy(float), label=grp)
            ax.fill_between(x, h.min().to_numpy(float), h.max().to_numpy(float), color=line.get_color(), alpha=0.15)
    ax.set_xlabel("epoch")
    ax.set_ylabel(col)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def status_lines(df: pd.DataFrame, sweep_dir: Path) -> list[str]:
    """What has not finished, and the command that continues it."""
    runs = df.drop_duplicates("run")
    missing = runs[runs["status"] != "finished"]
    if missing.empty:
        return [f"All {len(runs)} runs finished."]
    from vispe.sweep.collect import last_error

    lines = [f"{len(runs) - len(missing)} of {len(runs)} runs finished; not finished here (partial):"]
    for r in missing.itertuples():
        err = last_error(Path(sweep_dir) / r.run) if r.status == "failed" else None
        lines.append(f"- `{r.run}`: {r.status}" + (f": `{err}`" if err else ""))
    failed = "Failed runs stop again until their cause is fixed (their train.log says why); then c" \
        if (missing["status"] == "failed").any() else "C"
    lines.append(f"{failed}ontinue with the same sweep command(s) listed below: finished runs are skipped, "
                 "interrupted ones resume from their checkpoints.")
    return lines


def mixed_device_lines(df: pd.DataFrame) -> list[str]:
    """Groups whose finished runs trained on different devices (a device string names the CPU or GPU
    and torch's threads): their mean +- std mixes two sources of difference, since another thread
    count or device changes the order of reductions and so every number of a seed (on CPU, one
    thread against two moved a detector's AP as much as a seed: docs/training.md)."""
    fin = add_group(df[df["status"] == "finished"].drop_duplicates("run"))
    if fin.empty or "device" not in fin:
        return []
    lines = []
    for group, runs in fin.groupby("group", sort=True):
        counts = runs["device"].fillna("unknown").astype(str).value_counts()
        if len(counts) > 1:
            lines.append(f"- `{group}`: " + "; ".join(f"{n} on {dev}" for dev, n in sorted(counts.items())))
    if lines:
        lines.insert(0, "**Mixed devices**: the seeds of these groups ran on different devices or thread counts, so "
                        "their spread is not the seeds' alone; rerun them on one (`train.threads=N` fixes the threads):")
    return lines


PROVENANCE = ("commit", "device", "threads", "torch", "date")  # what every row of a results CSV records (issue 53)


def provenance_lines(df: pd.DataFrame) -> list[str]:
    """Where the finished runs' rows came from: each of PROVENANCE with its values (``-`` for a run that did not
    record it, e.g. threads and date before issue 53)."""
    fin = df[df["status"] == "finished"].drop_duplicates("run")
    if fin.empty:
        return []
    cells = []
    for col in PROVENANCE:
        vals = fin[col] if col in fin else pd.Series(["-"] * len(fin), index=fin.index)
        vals = vals.map(lambda v: "-" if pd.isna(v) else (str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)))
        cells.append(f"{col} {', '.join(sorted(set(vals)))}")
    return ["Provenance of the rows (results.csv): " + "; ".join(cells) + "."]


def write_report(sweep_dir: str | Path) -> Path:
    """Collect, tabulate and plot a sweep folder; returns the path of report.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vispe.sweep.collect import collect

    sweep_dir = Path(sweep_dir)
    df = collect(sweep_dir)
    if df.empty:
        raise ValueError(f"sweep folder {str(sweep_dir)!r} holds no runs")
    metric = df["metric"].dropna().iloc[0] if "metric" in df and df["metric"].notna().any() else "acc"
    summary = summarize(df)
    parts = [f"# Sweep {sweep_dir.name}: test {metric}, mean ± std over seeds\n",
             markdown_table(summary, metric), "",
             "step ms = mean training time per optimiser step (data loading included); peak MiB = the "
             "run's peak memory (CPU: max RSS of the process; GPU: max allocated).", ""]
    parts += status_lines(df, sweep_dir) + [""]
    if mixed := mixed_device_lines(df):
        parts += mixed + [""]
    info = json.loads((sweep_dir / "sweep.json").read_text()) if (sweep_dir / "sweep.json").is_file() else {}
    if info.get("invocations"):
        parts.append("## Commands")
        for inv in info["invocations"]:
            parts.append(f"- `{inv['command']}`  \n  commit {inv.get('commit')}, {inv.get('machine')}, "
                         f"{inv.get('started')} - {inv.get('ended', 'not ended (stopped or running)')}")
    fin = df[df["status"] == "finished"].drop_duplicates("run")
    if len(fin):
        parts.append(f"\nTraining time, all finished runs: {fin['train_time_s'].sum() / 60:.1f} min; "
                     f"wall time {fin['wall_s'].sum() / 60:.1f} min. Devices: {', '.join(sorted(set(fin['device'])))}.")
    parts += provenance_lines(df)
    out = sweep_dir / "report.md"
    out.write_text("\n".join(parts) + "\n")
    if not summary.empty:
        for name, fig in (("metric_vs_size.png", plot_vs_size(summary, metric)),
                          ("curves.png", plot_curves(histories(sweep_dir, df), metric))):
            fig.savefig(sweep_dir / name, dpi=110)
            plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vispe.report", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep_dir", help="a folder made by python -m vispe.sweep")
    args = p.parse_args(argv)
    try:
        out = write_report(args.sweep_dir)
    except (ValueError, FileNotFoundError) as e:
        print(f"vispe.report: error: {e}", file=sys.stderr)
        return 2
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
