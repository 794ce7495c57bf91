"""Refresh results/compare from the sweep folders: CSV copies, figures and the tables in the .md files.

    .venv/bin/python results/compare/update.py [--sweeps runs/sweeps]

For each task with a sweep folder it writes the sweep's report (vispe.report), merges its tidy
``results.csv`` into ``results/compare/data/<task>.csv`` (vispe.sweep.collect.merge_tables: runs
committed from folders that are gone stay), the per-epoch metrics of its finished runs into
``data/<task>_curves.csv``, draws the merged metric-vs-size plot into ``figures/``, then rewrites
every block ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` of the Markdown files here from those
CSVs (the prose around the blocks is written by hand).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's vispe
sys.path.insert(0, str(HERE))

from vispe import report  # noqa: E402
from vispe.sweep import trace  # noqa: E402
from vispe.sweep.collect import merge_tables  # noqa: E402

import freshness  # noqa: E402  (results/compare/freshness.py, beside this file)
import prose_detr  # noqa: E402  (beside this file: detr_table3.md's figures in prose)
from current import TASKS, load, main_table, peg_table, resolution_table, status_table  # noqa: E402  (beside this file)
from tables_padding import leakage_table1, leakage_table4, redgreen_table  # noqa: E402  (beside this file)
import constant_offset  # noqa: E402  (beside this file: the constant-offset measurement, seconds)
import spread  # noqa: E402  (beside this file: the seeds' and machines' spread, reproducibility.md)
import tables_padding  # noqa: E402  (beside this file)
import readme_figure  # noqa: E402  (beside this file: the README figure and its caption)
import tables_dino  # noqa: E402  (beside this file: issue 47's tables, detr_dino.md)
import tables_realtime  # noqa: E402  (beside this file: issue 48's tables, detr_realtime.md)
import tables_vit  # noqa: E402  (beside this file: issue 49's tables, detr_vit.md)

SWEEPS = TASKS + ("shapes_detr", "shapes_detr_queries", "shapes_detr_init", "shapes_detr_init_1thread",
                  "shapes_deformable_detr", "shapes_dino", "shapes_dino_short", "relbias_init_vit",
                  "relbias_init_torch", "shapes_rfdetr")
SWEEPS += tables_realtime.SWEEPS  # issue 48: RT-DETR and D-FINE on the shapes set
INITS = (("relbias_init_vit", "ViT / timm default (`weight_init=''`: trunc-normal 0.02, zero biases)"),
         ("relbias_init_torch", "PyTorch default (`model.kwargs.weight_init=torch`: Kaiming-uniform, std ~0.07, non-zero biases)"))
CHANCE = {"digits_cell": 1 / 9, "digits_relative": 1 / 4, "digits_content_position": 1 / 20, "digits_class": 1 / 10}


def _finished(df: pd.DataFrame | None, train_size: bool = True) -> pd.DataFrame | None:
    """The finished runs' rows of ``df`` (at the training size only, by default) with their group; None when
    none finished (a sweep folder of unfinished runs writes a table with no metric yet)."""
    if df is None or "is_train_size" not in df:
        return None
    fin = df[df["status"] == "finished"]
    fin = fin[fin["is_train_size"].astype(bool)] if train_size else fin
    return None if fin.empty else report.add_group(fin)


def today_vs_old(task: str) -> str:
    """Test accuracy at the training size: the rerun at today's code (data/<task>_today.csv) beside the
    old grid, seed 0 of each beside the other (equal when the code path did not change), and the
    difference of means in the seeds' spread (the old grid's std with one seed today, else both
    pooled: reproducibility.md's unit)."""
    new, old = load(f"{task}_today"), load(task)
    if new is None or old is None:
        return "(not run here)"
    n = report.summarize(new)
    n = n[n["is_train_size"].astype(bool)].set_index("group")
    o = report.summarize(old)
    o = o[o["is_train_size"].astype(bool)].set_index("group")
    commits = lambda df: ", ".join(sorted({c[:7] for c in df["commit"].dropna()}))  # noqa: E731
    lines = [f"| encoding | today ({commits(new)}) | old grid ({commits(old)}) | seed 0: today / old | "
             "today - old, in seed stds |", "|---|---|---|---|---|"]
    ng, og = report.add_group(new), report.add_group(old)

    def cell(s, g):
        k = int(s.loc[g, "n"])
        return report.fmt(s.loc[g, "mean"], s.loc[g, "std"], k) + (f" ({k} seeds)" if k > 1 else "")

    def seed0(df, g):
        a = df[(df["group"] == g) & (df["seed"] == 0) & df["is_train_size"].astype(bool)]["acc"]
        return f"{a.iloc[0]:.3f}" if len(a) else "-"

    for g in n.sort_values("mean", ascending=False).index:
        today = cell(n, g)
        if g not in o.index:
            lines.append(f"| {g} | {today} | - | {seed0(ng, g)} / - | - |")
            continue
        d = n.loc[g, "mean"] - o.loc[g, "mean"]
        stds = [o.loc[g, "std"]] + ([n.loc[g, "std"]] if n.loc[g, "n"] > 1 else [])
        unit = (sum(x * x for x in stds) / len(stds)) ** 0.5
        z = f" ({d / unit:+.1f})" if unit > 0 else ""
        lines.append(f"| {g} | {today} | {cell(o, g)} | "
                     f"{seed0(ng, g)} / {seed0(og, g)} | {d:+.3f}{z} |")
    return "\n".join(lines)


def relbias_init_table() -> str:
    """relbias on digits_relative under the two initialisations: per seed and mean, at the training size."""
    lines = ["| initialisation | seed 0 | seed 1 | seed 2 | mean ± std | seeds above chance + 0.05 | commit |",
             "|---|---|---|---|---|---|---|"]
    for name, label in INITS:
        df = load(name)
        fin = _finished(df)
        if fin is None:
            lines.append(f"| {label} | not run | | | | | |")
            continue
        at = fin.set_index("run")["acc"]
        seeds = [at.get(f"relbias_seed{i}", float("nan")) for i in range(3)]
        got = at.dropna()
        above = int((got > CHANCE["digits_relative"] + 0.05).sum())
        commit = ", ".join(sorted({c[:7] for c in df["commit"].dropna()}))
        lines.append(f"| {label} | " + " | ".join("-" if v != v else f"{v:.3f}" for v in seeds)
                     + f" | {report.fmt(got.mean(), got.std(), len(got))} | {above} of {len(got)} | {commit} |")
    return "\n".join(lines)


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
    fin = _finished(df)
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
        fin = _finished(df)
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
    fin = _finished(load(csv), train_size=False)
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


BLOCKS = {**{f"main:{t}": (lambda t=t: main_table(t)) for t in TASKS},
          **{f"resolution:{t}": (lambda t=t: resolution_table(t)) for t in TASKS},
          **{f"main:{t}_today": (lambda t=t: main_table(t, today_only=True)) for t in TASKS},
          **{f"today_vs_old:{t}": (lambda t=t: today_vs_old(t)) for t in TASKS},
          "peg": peg_table, "status": status_table, "detr": detr_table, "detr_queries": queries_table, "detr_init": init_relation_table, "detr_deformable": deformable_table, "detr_dino": lambda: tables_dino.dino_table(_ap_row), "detr_dino_epochs": tables_dino.epochs_table,
          "detr_dino_short": tables_dino.short_table, "detr_dino_step": tables_dino.step_ratio, "relbias_init": relbias_init_table, "redgreen": redgreen_table, "islam_table1": leakage_table1,
          "islam_table4": leakage_table4, "constant_offset": constant_offset.markdown,
          **{f"spread:{f.__name__}": f for f in (spread.seed_spread, spread.reruns, spread.machines)},
          "provenance": lambda: freshness.markdown(freshness.check()),
          "detr_table3_runtime": prose_detr.table3_runtime, "detr_queries_scale": prose_detr.queries_scale,
          "detr_init_reading": prose_detr.init_reading}
BLOCKS.update({"leakage_cnn": tables_padding.leakage_cnn_table, "leakage_targets": tables_padding.leakage_targets_table,
               "leakage_vit": tables_padding.leakage_vit_table})  # results/padding_leakage.md's tables (issue 53)
BLOCKS.update({"readme_caption": readme_figure.caption})  # README.md's figure caption, from its CSV (issue 53)
BLOCKS.update({"detr_realtime": lambda: tables_realtime.realtime_table(_ap_row), "detr_realtime_sizes":
               tables_realtime.sizes_table, "detr_realtime_step": tables_realtime.step_ratio,
               "detr_realtime_paired": tables_realtime.paired_table})  # issue 48
BLOCKS.update({"detr_vit": tables_vit.vit_table, "detr_vit_paired": tables_vit.paired_table,
               "detr_vit_step": tables_vit.step_ratio})  # results/compare/detr_vit.md (issue 49)


STATUS = re.compile(r"(<!-- BEGIN freshness:([\w.-]+) -->\n)(?:.*?\n)?(<!-- END freshness:\2 -->)", re.S)


def status_block(name: str) -> str:
    """The status of ``data/<name>.csv`` (or ``results/<name>.csv``), for the page that shows its rows."""
    root = HERE.parents[1]
    csv = next((p for p in (HERE / "data" / f"{name}.csv", root / "results" / f"{name}.csv") if p.is_file()), None)
    if csv is None:
        raise ValueError(f"freshness block {name!r}: no CSV data/{name}.csv or results/{name}.csv")
    return freshness.status_line(freshness.judge(root, csv, freshness.load_marks(root)))


def render(text: str) -> str:
    """``text`` with every block this script writes regenerated from the committed CSVs and marks."""
    for name, fn in BLOCKS.items():
        pat = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n)(?:.*?\n)?(<!-- END {re.escape(name)} -->)", re.S)
        if pat.search(text):
            text = pat.sub(lambda m: m.group(1) + fn() + "\n" + m.group(2), text)
    return STATUS.sub(lambda m: m.group(1) + status_block(m.group(2)) + "\n" + m.group(3), text)


PAGES = ("results/compare/*.md", "results/*.md", "docs/results.md", "README.md")


def pages() -> list[Path]:
    """Every page whose blocks this script writes."""
    root = HERE.parents[1]
    return sorted({p for g in PAGES for p in root.glob(g)})


def fill(md: Path) -> None:
    text = md.read_text()
    new = render(text)
    if new != text:
        md.write_text(new)


def write_code(task: str, sweep: Path, fresh: pd.DataFrame, df: pd.DataFrame) -> None:
    """data/<task>_code.json: per commit of the merged table, the files its runs used and their hashes (the runs'
    imports.json, vispe.sweep.trace), so that freshness.py judges those rows by them; null: not traced."""
    f = HERE / "data" / f"{task}_code.json"
    code = trace.merge(json.loads(f.read_text()) if f.is_file() else {}, trace.by_commit(sweep, fresh))
    code = {c: v for c, v in sorted(code.items()) if c in set(df["commit"].dropna().astype(str))}
    if any(v is not None for v in code.values()):
        f.write_text(json.dumps(code, indent=1, sort_keys=True) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", default=str(HERE.parents[1] / "runs" / "sweeps"))
    p.add_argument("--today", default=str(HERE.parents[1] / "runs" / "sweeps_today"),
                   help="sweeps rerun at today's code: merged into data/<task>_today.csv, beside the old table")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a results CSV is stale (code changed since its runs) and unmarked, or its mark expired")
    p.add_argument("--mark", metavar="CSV", help="mark CSV in results/stale.json: --reason and --evidence, or --record")
    p.add_argument("--reason", default="", help="with --mark: why the table was not rerun")
    p.add_argument("--evidence", default="", help="with --mark: what shows the rows still hold at this checkout")
    p.add_argument("--record", action="store_true", help="with --mark: keep the rows as the record of their commit")
    p.add_argument("--note", nargs=2, metavar=("CSV", "TEXT"), help="say why CSV stays STALE (what differs, from "
                   "which commit): shown by --check and on the pages, it covers nothing")
    p.add_argument("--remark", metavar="NAME", help="re-mark data/NAME.csv from its smoke runs (remark.py)")
    p.add_argument("--against", default=None, help="with --remark: the commit to compare against")
    p.add_argument("--pages", action="store_true", help="only rewrite the pages' blocks (no sweep folders read)")
    args = p.parse_args(argv)
    if args.check:
        text, rc = freshness.report(freshness.check())
        print(text)
        return rc
    if args.mark:
        print(freshness.mark(args.mark, args.reason, evidence=args.evidence, record=args.record))
        return 0
    if args.note:
        print(freshness.note(*args.note))
        return 0
    if args.remark:
        import remark  # noqa: PLC0415  (beside this file; runs training, so only loaded here)

        return remark.remark(args.remark, args.against)
    if args.pages:
        for md in pages():
            fill(md)
        return 0
    (HERE / "data").mkdir(exist_ok=True)
    (HERE / "figures").mkdir(exist_ok=True)
    for task, sweep in [(t, Path(args.sweeps) / t) for t in SWEEPS] + [(f"{t}_today", Path(args.today) / t) for t in TASKS]:
        if not (sweep / "sweep.json").is_file():
            continue
        report.write_report(sweep)  # the sweep folder's own report of the runs there
        fresh = pd.read_csv(sweep / "results.csv")
        df = merge_tables(load(task), fresh)  # committed runs whose folders are gone stay
        df.to_csv(HERE / "data" / f"{task}.csv", index=False)
        write_code(task, sweep, fresh, df)
        curves, hist = HERE / "data" / f"{task}_curves.csv", report.histories(sweep, fresh)
        old = pd.read_csv(curves) if curves.is_file() else pd.DataFrame(columns=["run"])
        kept = set(df["run"]) - set(hist["run"] if len(hist) else [])
        hist = pd.concat([old[old["run"].isin(kept)], hist], ignore_index=True)
        if not hist.empty:
            hist.to_csv(curves, index=False)
        summ = report.summarize(df)
        if not summ.empty:
            fig = report.plot_vs_size(summ, str(df["metric"].iloc[0]))
            fig.savefig(HERE / "figures" / f"{task}_vs_size.png", dpi=110)
            plt.close(fig)
    for md in pages():
        fill(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
