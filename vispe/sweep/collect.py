"""Collect a sweep folder into one tidy table: one row per (run, evaluation size).

Columns: ``run``, ``status`` (finished / unfinished / failed / not started), ``encoding``, ``label`` (the
encoding, and a detector's design where it is not DETR's own: ``sine (dab, boxrpb)``), ``seed``, one
column per override and per ``--vary`` key (named by the dotted key), ``task``, ``data``, ``model``,
``metric`` (the task's primary metric, e.g. ``acc`` or ``AP``), ``train_size``, ``eval_size``,
``scale``, ``is_train_size``, ``value`` (the primary metric at that size), every other metric the
task reports at that size, ``params``, ``epochs``, ``steps``, ``step_time_s`` (mean training time per
optimiser step), ``peak_mem_mb`` and ``peak_mem_kind``, ``train_time_s``, ``wall_s``, ``device``, ``threads`` (torch's),
``torch``, ``date`` (UTC day the run finished; ``date_from`` = ``run``), ``commit``. A run that has not finished has one row with empty metrics, so a report can say what is
missing.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

POINT_FILE = "point.json"  # written by the sweep into each run folder before it runs
RESULTS_FILE = "results.csv"
#: the columns every table has, even when no run finished (a folder of unfinished runs): readers select on them
COLUMNS = ("run", "status", "encoding", "label", "seed", "task", "data", "model", "metric", "train_size", "eval_size",
           "scale", "is_train_size", "value", "commit")
_RUN_KEYS = ("params", "epochs", "steps", "step_time_s", "peak_mem_mb", "peak_mem_kind", "train_time_s",
             "eval_time_s", "device", "world_size", "torch", "threads", "date")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def last_error(folder: Path) -> str | None:
    """The last error line train.py wrote to ``<folder>/train.log`` (``train.py: error: ...`` or a
    traceback's last line), or None."""
    try:
        lines = (Path(folder) / "train.log").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("train.py: error:") or line.startswith(("Traceback", "$ ")):
            break
    else:
        return None
    if line.startswith("train.py: error:"):
        return line.strip()
    tail = [x for x in lines[lines.index(line):] if x.strip()]
    return tail[-1].strip() if line.startswith("Traceback") and len(tail) > 1 else None


def run_status(folder: Path, point: dict | None) -> str:
    from vispe.train import rundir

    st = rundir.state(folder)
    if st == "finished":
        return "finished"
    if point and point.get("last_rc") not in (None, 0, 130):  # 130: stopped by Ctrl-C / SIGTERM, resumable
        return "failed"
    return "unfinished" if st == "unfinished" else "not started"


def run_rows(folder: Path) -> list[dict]:
    """The rows of one run folder (a grid point)."""
    point = _read_json(folder / POINT_FILE) or {}
    top = _read_json(folder / "summary.json") or {}
    status = run_status(folder, point)
    pe = point.get("pe") or next(iter(top.get("encodings", {})), None)
    base = {"run": folder.name, "status": status, "encoding": pe, "label": point.get("label"),
            "seed": point.get("seed")}  # label: None for runs of older versions (report: the encoding)
    for o in point.get("overrides", []):
        key, _, value = o.partition("=")
        base[key] = value
    base.update(point.get("vary", {}))
    summ = _read_json(folder / str(pe) / "summary.json") if pe else None
    if status != "finished" or not summ:
        return [{**base, "commit": point.get("commit")}]
    metric = summ["primary"]
    base["label"] = summ.get("label", base["label"])
    base.update({"task": summ.get("task"), "data": summ.get("data"), "model": summ.get("model"), "metric": metric,
                 "train_size": summ.get("train_img_size")})
    run = {k: summ.get(k) for k in _RUN_KEYS}
    run.update({"wall_s": top.get("runtime_s"), "commit": point.get("commit")})
    if run["threads"] is None:  # summaries written before issue 53: the device string names them
        m = re.search(r"(\d+) torch thread", str(run["device"]))
        run["threads"] = int(m.group(1)) if m else None
    run["date_from"] = "run" if run["date"] else None
    rows = []
    for size, res in sorted(summ["eval"].items(), key=lambda kv: int(kv[0])):
        extra = {k: v for k, v in res.items() if k != "scale"}
        rows.append({**base, "eval_size": int(size), "scale": res.get("scale"),
                     "is_train_size": int(size) == summ.get("train_img_size"), "value": res.get(metric),
                     **extra, **run})
    return rows


def run_folders(sweep_dir: Path) -> list[Path]:
    """Sub-folders that are grid points (hold point.json or a train.py config.yaml)."""
    return sorted(p for p in Path(sweep_dir).iterdir()
                  if p.is_dir() and ((p / POINT_FILE).is_file() or (p / "config.yaml").is_file()))


def collect(sweep_dir: str | Path, *, write: bool = True):
    """A pandas DataFrame of every run of ``sweep_dir``; also written to ``<sweep_dir>/results.csv``."""
    import pandas as pd

    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep folder {str(sweep_dir)!r} does not exist")
    rows = [r for f in run_folders(sweep_dir) for r in run_rows(f)]
    df = pd.DataFrame(rows)
    if len(df):  # a folder of unfinished runs has no metric columns yet: add them, empty
        df = df.reindex(columns=list(dict.fromkeys([*df.columns, *COLUMNS])))
    if write:
        tmp = sweep_dir / (RESULTS_FILE + ".tmp")
        with_integers(df, rows).to_csv(tmp, index=False)
        tmp.replace(sweep_dir / RESULTS_FILE)
    return df


def with_integers(df, rows: list[dict]):
    """``df`` with each column whose values in ``rows`` are all integers as integers (``Int64``): a run that has not
    finished has no evaluation size, steps, ..., and pandas makes such a column float (``16.0`` in the CSV)."""
    out = df.copy()
    for c in out.columns:
        vals = [r[c] for r in rows if r.get(c) is not None]
        if vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals) and out[c].dtype.kind == "f":
            out[c] = out[c].astype("Int64")
    return out


def merge_tables(kept, fresh):
    """One tidy table from an earlier ``results.csv`` (``kept``, e.g. a committed copy whose run
    folders are gone) and a fresh one (``fresh``, collected from the folders there now), by run name:
    a run's rows come from ``fresh`` unless only ``kept`` has it finished. Rows keep each run's order
    of first appearance (``kept``'s runs first)."""
    import pandas as pd

    def finished(df) -> set:
        return set(df.loc[df["status"] == "finished", "run"]) if len(df) else set()

    if kept is None or not len(kept):
        return fresh.reset_index(drop=True)
    if fresh is None or not len(fresh):
        return kept.reset_index(drop=True)
    from_kept = (set(kept["run"]) - set(fresh["run"])) | (finished(kept) - finished(fresh))
    parts = [kept[kept["run"].isin(from_kept)], fresh[~fresh["run"].isin(from_kept)]]
    out = pd.concat(parts, ignore_index=True)
    order = {r: i for i, r in enumerate(dict.fromkeys(list(kept["run"]) + list(fresh["run"])))}
    return out.sort_values("run", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
