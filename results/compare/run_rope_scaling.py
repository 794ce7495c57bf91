"""RoPE resolution scaling at evaluation time, and centred fixed codes (issue 27, part B).

    OMP_NUM_THREADS=1 .venv/bin/python results/compare/run_rope_scaling.py                # rope rows, seeds 0,1,2
    OMP_NUM_THREADS=1 .venv/bin/python results/compare/run_rope_scaling.py --seeds 0      # fewer seeds
    OMP_NUM_THREADS=1 .venv/bin/python results/compare/run_rope_scaling.py --center       # + the centring rows
    OMP_NUM_THREADS=1 .venv/bin/python results/compare/run_rope_scaling.py --center --no-scaling  # centring rows only
    .venv/bin/python results/compare/run_rope_scaling.py --report                         # tables from the CSVs only

Scaling rows: ``rope_axial`` is trained once per seed with ``train.py`` at the task's size (32 px,
8x8 tokens; ``train.eval_sizes=[1.0]``), then its checkpoint is evaluated at 0.5x-2x under every
scaling (the scaling has no parameters, so one checkpoint serves all): ``none``; ``none`` with
``ref_grid=(8, 8)`` (EVA-02's rescale, position interpolation in both directions); ``pi``, ``ntk``,
``yarn`` (``ref_grid=(8, 8)``, per axis; the test grids are square, where tied is the same).
Rows go to ``data/rope_scaling_<task>.csv``.

Centring rows (``--center``): ``sine`` and ``sincos2d`` with ``center=True`` trained with
``train.py`` on digits_content_position (30 epochs, 0.5x-2x), seeds of ``--center-seeds``; rows go
to ``data/digits_content_position_centred.csv``, shown beside the uncentred runs of the
committed grids (``data/digits_content_position_fixed_codes_at_8ed29d3.csv``, 3 seeds, and
``data/digits_content_position_today.csv``, seed 0) and learned_abs.

Runs are kept under ``runs/rope_scaling/`` (a finished one is not trained again). The tables are
written between markers into ``rope_scaling.md``; the text around them is kept. Every CSV row
names the commit it ran from (``git rev-parse HEAD``): run it from a clean checkout or a
``git archive`` snapshot so that the commit is the code.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's vispe

HERE = ROOT / "results" / "compare"
RUNS = ROOT / "runs" / "rope_scaling"
SCALES = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
REF = [8, 8]  # the training grid: 32 px / patch 4
VARIANTS = {  # name -> pe_kwargs at evaluation
    "none": {},
    "none + ref_grid (EVA rescale)": {"ref_grid": REF},
    "pi": {"scaling": "pi", "ref_grid": REF},
    "ntk": {"scaling": "ntk", "ref_grid": REF},
    "yarn": {"scaling": "yarn", "ref_grid": REF},
}
CENTRE_TASK = "digits_content_position"


def commit() -> str:
    sha = os.environ.get("VISPE_COMMIT")  # a git-archive snapshot has no .git: its commit is given
    if sha is None:
        f = ROOT / ".vispe-commit"
        sha = f.read_text().strip() if f.exists() else subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return sha


def train(task: str, seed: int, pe: str, name: str, extra: list[str], eval_sizes: list[float]) -> Path:
    """Train one encoding with train.py unless its run folder says it finished; return that folder."""
    out = RUNS / name
    summary = out / pe / "summary.json"
    if summary.exists() and json.loads(summary.read_text()).get("finished"):
        return out / pe
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / f"{task}.yaml"),
           f"model.pe={pe}", "train.compare=[]", f"train.seed={seed}", "train.threads=1", "train.progress=false",
           f"train.eval_sizes=[{','.join(map(str, eval_sizes))}]", f"train.out_dir={RUNS}", f"train.run_name={name}",
           *extra]
    resume = ["--resume"] if (out / pe / "checkpoint.pt").exists() else []
    print("+", " ".join(cmd[1:] + resume), flush=True)
    subprocess.run(cmd + resume, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    (out / pe / "vispe-commit.txt").write_text(commit())  # the code this run trained from
    return out / pe


def run_commit(run: Path) -> str:
    """The commit a run trained from (recorded by ``train``), else this checkout's."""
    f = run / "vispe-commit.txt"
    return f.read_text().strip() if f.exists() else commit()


def evaluate_under(run: Path, variants: dict) -> list[dict]:
    """The checkpoint of ``run`` evaluated at every scale under each variant's pe_kwargs."""
    import torch
    from omegaconf import OmegaConf

    from vispe.train import checkpoint as ckpt
    from vispe.train import config as C
    from vispe.train.distributed import DistInfo
    from vispe.train.runner import build_data, build_model, evaluate_sizes
    from vispe.train.tasks import get_task

    torch.set_num_threads(1)
    state = ckpt.load(run / "checkpoint.pt")
    rows = []
    data = None
    for variant, kw in variants.items():
        cfg = C.load_config(run / "config.yaml")
        cfg.train.eval_sizes = SCALES
        cfg.model.pe_kwargs = OmegaConf.create(kw)
        task = get_task(cfg.task)
        data = data or build_data(task, cfg)  # the same test sets for every variant
        model = build_model(task, cfg, data)
        ckpt.check_compatible(state, model, OmegaConf.to_container(cfg, resolve=True), run / "checkpoint.pt")
        model.load_state_dict(state["model"])
        model.eval()
        pes = [mod for mod in model.modules() if hasattr(mod, "scaling")]  # the settings reached every encoding
        ref = tuple(kw["ref_grid"]) if "ref_grid" in kw else None
        if not pes or any(pe.scaling != kw.get("scaling", "none") or pe.ref_grid != ref for pe in pes):
            raise RuntimeError(f"{variant}: the model's rotary encodings do not carry pe_kwargs {kw}")
        res = evaluate_sizes(model, task, cfg, data, device=torch.device("cpu"), amp_dtype=None, dist=DistInfo())
        for size, m in res.items():
            rows.append({"variant": variant, "pe_kwargs": json.dumps(kw), "eval_size": int(size),
                         "scale": m["scale"], "acc": round(m["acc"], 4), "loss": round(m["loss"], 4)})
        print(f"  {run.parent.name} {variant}: " + "  ".join(f"{r['eval_size']}px {r['acc']:.3f}"
                                                           for r in rows if r["variant"] == variant), flush=True)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_csv(path, index=False)
    print("wrote", path.relative_to(ROOT))


def run_scaling(task: str, seeds: list[int]) -> None:
    rows = []
    sha = commit()
    for seed in seeds:
        run = train(task, seed, "rope_axial", f"{task}_rope_axial_seed{seed}", [], [1.0])
        summary = json.loads((run / "summary.json").read_text())
        for r in evaluate_under(run, VARIANTS):
            rows.append({"task": task, "encoding": "rope_axial", "seed": seed, **r,
                         "train_acc": round(summary["final"].get("train_acc", float("nan")), 4),
                         "train_time_s": summary["train_time_s"], "device": summary["device"],
                         "torch": summary["torch"], "commit": sha})
    write_csv(HERE / "data" / f"rope_scaling_{task}.csv", rows)


def run_centring(seeds: list[int]) -> None:
    rows = []
    for pe in ("sine", "sincos2d"):
        for seed in seeds:
            run = train(CENTRE_TASK, seed, pe, f"{CENTRE_TASK}_{pe}_center_seed{seed}", ["model.pe_kwargs.center=true"],
                        SCALES)
            s, sha = json.loads((run / "summary.json").read_text()), run_commit(run)
            for size, m in s["eval"].items():
                rows.append({"task": CENTRE_TASK, "encoding": pe, "variant": "center=True", "seed": seed,
                             "eval_size": int(size), "scale": m["scale"], "acc": round(m["acc"], 4),
                             "train_acc": round(s["final"]["train_acc"], 4), "train_time_s": s["train_time_s"],
                             "device": s["device"], "torch": s["torch"], "commit": sha})
            write_csv(HERE / "data" / f"{CENTRE_TASK}_centred.csv", rows)  # after each run: a stop keeps the rest


# --- tables --------------------------------------------------------------------------------------
def _cell(values) -> str:
    import numpy as np

    v = np.asarray(values, dtype=float)
    return f"{v.mean():.3f}" + (f" ± {v.std(ddof=1):.3f}" if len(v) > 1 else "")


def scaling_table(task: str) -> str:
    import pandas as pd

    path = HERE / "data" / f"rope_scaling_{task}.csv"
    if not path.exists():
        return f"(no data yet: run `run_rope_scaling.py --task {task}`)"
    df = pd.read_csv(path)
    sizes = sorted(df.eval_size.unique())
    train_size = int(df.loc[df.scale == 1.0, "eval_size"].iloc[0])
    head = "| scaling (at evaluation) | seeds | " + " | ".join(
        f"acc @{s}px" + (" (train)" if s == train_size else "") for s in sizes) + " |"
    lines = [head, "|" + "---|" * (len(sizes) + 2)]
    none = df[df.variant == "none"].groupby("eval_size").acc.mean()
    delta = ["", "Change from `none` at the same size (mean over seeds):", "",
             "| scaling | " + " | ".join(f"Δ @{s}px" for s in sizes) + " |", "|" + "---|" * (len(sizes) + 1)]
    for variant in VARIANTS:
        d = df[df.variant == variant]
        if d.empty:
            continue
        cells = [_cell(d[d.eval_size == s].acc) for s in sizes]
        lines.append(f"| {variant} | {d.seed.nunique()} | " + " | ".join(cells) + " |")
        m = d.groupby("eval_size").acc.mean()
        delta.append(f"| {variant} | " + " | ".join(f"{m[s] - none[s]:+.3f}" for s in sizes) + " |")
    meta = (f"\nSeeds {sorted(df.seed.unique().tolist())}; rope_axial trained at {train_size} px "
            f"(train accuracy {_cell(df.drop_duplicates('seed').train_acc)}, "
            f"{df.drop_duplicates('seed').train_time_s.mean():.0f} s of training per seed); "
            f"commit `{df.commit.iloc[0][:7]}`; device: {df.device.iloc[0]}; torch {df.torch.iloc[0]}.")
    return "\n".join(lines + delta) + "\n" + meta


def centring_table() -> str:
    import pandas as pd

    path = HERE / "data" / f"{CENTRE_TASK}_centred.csv"
    if not path.exists():
        return ("Not run. The command (about 2 x 4-12 min of one CPU thread per seed):\n\n"
                "    OMP_NUM_THREADS=1 .venv/bin/python results/compare/run_rope_scaling.py --center --no-scaling "
                "--center-seeds 0")
    new = pd.read_csv(path)
    sizes = sorted(new.eval_size.unique())
    lines = ["| encoding | commit | seeds | " + " | ".join(f"acc @{s}px" for s in sizes) + " | train acc (last epoch) |",
             "|" + "---|" * (len(sizes) + 4)]
    old = []
    for name in ("digits_content_position", "digits_content_position_fixed_codes_at_8ed29d3",
                 "digits_content_position_today"):  # the main grid, the fixed codes rerun, today's code
        p = HERE / "data" / f"{name}.csv"
        if p.exists():
            old.append((pd.read_csv(p), HERE / "data" / f"{name}_curves.csv"))
    for pe in ("sine", "sincos2d", "learned_abs"):
        for d, curves in old:
            d = d[(d.encoding == pe) & (d.status == "finished") & d.value.notna()]
            d = d[~d.run.str.contains("+", regex=False)]  # the encoding's defaults only (no --vary arm)
            if d.empty:
                continue
            tr = ""
            if curves.exists():
                c = pd.read_csv(curves)
                c = c[c.run.isin(d.run)]
                last = c[c.epoch == c.epoch.max()]
                tr = _cell(last.train_acc) if not last.empty else ""
            cells = [_cell(d[d.eval_size == s].value) if (d.eval_size == s).any() else "" for s in sizes]
            shas = ", ".join(f"`{c[:7]}`" for c in sorted(set(d.commit)))
            lines.append(f"| {pe} | {shas} | {d.seed.nunique()} | " + " | ".join(cells) + f" | {tr} |")
        d = new[new.encoding == pe]
        if not d.empty:
            cells = [_cell(d[d.eval_size == s].acc) for s in sizes]
            lines.append(f"| **{pe}, center=True** | " + ", ".join(f"`{c[:7]}`" for c in sorted(set(d.commit))) + f" | {d.seed.nunique()} | " + " | ".join(cells)
                         + f" | {_cell(d.drop_duplicates('seed').train_acc)} |")
    meta = f"\nCentred runs: device {new.device.iloc[0]}, torch {new.torch.iloc[0]}, " \
           f"{new.drop_duplicates(['encoding', 'seed']).train_time_s.mean():.0f} s of training per run."
    return "\n".join(lines) + "\n" + meta


def write_md(tasks: list[str]) -> None:
    md = HERE / "rope_scaling.md"
    text = md.read_text() if md.exists() else "# RoPE resolution scaling and centred fixed codes (issue 27)\n"
    blocks = {f"scaling:{t}": scaling_table(t) for t in tasks}
    blocks["centring"] = centring_table()
    for key, body in blocks.items():
        begin, end = f"<!-- BEGIN {key} -->", f"<!-- END {key} -->"
        if begin in text:
            pre, rest = text.split(begin, 1)
            text = pre + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]
        else:
            text += f"\n## {key}\n\n{begin}\n{body}\n{end}\n"
    md.write_text(text)
    print("wrote", md.relative_to(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", action="append", help="embedded task(s) of the scaling rows (default digits_cell)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--center", action="store_true", help="also train the centring rows")
    p.add_argument("--no-scaling", action="store_true", help="skip the scaling rows (e.g. with --center alone)")
    p.add_argument("--center-seeds", default="0")
    p.add_argument("--report", action="store_true", help="only rewrite the tables from the CSVs")
    a = p.parse_args(argv)
    tasks = a.task or ["digits_cell"]
    if not a.report:
        for t in [] if a.no_scaling else tasks:
            run_scaling(t, [int(s) for s in a.seeds.split(",")])
        if a.center:
            run_centring([int(s) for s in a.center_seeds.split(",")])
    present = sorted(p.stem[len("rope_scaling_"):] for p in (HERE / "data").glob("rope_scaling_*.csv"))
    write_md(sorted(set(tasks) | set(present)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
