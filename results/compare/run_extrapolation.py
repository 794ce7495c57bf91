"""Resolution extrapolation of the rotation and direction encodings (issue 38).

    OMP_NUM_THREADS=1 .venv/bin/python results/compare/run_extrapolation.py --lock /work/heavy.lock  # seeds 0,1,2
    OMP_NUM_THREADS=1 .venv/bin/python results/compare/run_extrapolation.py --seeds 0     # fewer seeds
    .venv/bin/python results/compare/run_extrapolation.py --report                        # tables from the CSV only
    ... run_extrapolation.py --lane 0/2 & ... run_extrapolation.py --lane 1/2 &            # two lanes side by side

Each encoding of ``ENCODINGS`` is trained once per seed with ``train.py`` on ``digits_cell`` at its
size (32 px, 8 x 8 tokens, 10 epochs, ``train.eval_sizes=[1.0]``); the checkpoint is then
evaluated at every size of ``SIZES`` (0.5x-4x square, and non-square; ``BIG_SUBSET`` test samples
above 64 x 64 px, where attention over 1,024 tokens dominates the cost, all 1,000 below) under
each of its variants
(settings at evaluation only, the checkpoint unchanged): RoPE-Mixed with PI and YaRN (``ref_grid=(8,
8)``), RoPE-axial and STRING with PI (YaRN equals PI for rope_axial on this grid, rope_scaling.md),
LieRE with its reference's ``scale_0_to_1`` (``coords="normalized"``).
Rows go to ``data/extrapolation_digits_cell.csv``, tables into ``extrapolation.md`` (between
markers; the text around them is kept). Runs are kept under ``runs/extrapolation/`` (a finished one
is not trained again). Every row names the commit it ran from: run it from a clean checkout or a
``git archive`` snapshot (``VISPE_COMMIT`` or ``.vispe-commit`` then names it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's vispe

HERE = ROOT / "results" / "compare"
RUNS = ROOT / "runs" / "extrapolation"
TASK = "digits_cell"
REF = [8, 8]  # the training grid: 32 px / patch 4
#: evaluation sizes (H, W) in pixels: 0.5x-4x square, then non-square
SIZES = [(16, 16), (24, 24), (32, 32), (48, 48), (64, 64), (128, 128), (32, 64), (64, 32), (24, 48)]
#: test samples at sizes above 64 x 64 px (the first ones of the 1,000; all 1,000 at the others)
BIG_SUBSET = 200
PI = {"pi": {"scaling": "pi", "ref_grid": REF}}
ROPE = {**PI, "yarn": {"scaling": "yarn", "ref_grid": REF}}
#: encoding -> {variant: pe_kwargs at evaluation}; "" is the encoding as trained
ENCODINGS = {
    "liere": {"": {}, "scale_0_to_1": {"coords": "normalized"}},
    "comrope": {"": {}},
    "string": {"": {}, **PI},
    "lookhere": {"": {}},
    "rope_axial": {"": {}, **PI},  # YaRN = PI for rope_axial on this grid (rope_scaling.md)
    "rope_mixed": {"": {}, **ROPE},
    "learned_abs": {"": {}},
    "relbias": {"": {}},
}


LOCK: list[str] = []  # --lock PATH: flock it around each training + evaluation


class heavy_lock:
    def __enter__(self):
        self.f = open(LOCK[0], "a") if LOCK else None
        if self.f:
            import fcntl

            fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        if self.f:
            self.f.close()  # releases the lock


def commit() -> str:
    sha = os.environ.get("VISPE_COMMIT")
    if sha is None:
        f = ROOT / ".vispe-commit"
        sha = f.read_text().strip() if f.exists() else subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return sha


def machine() -> str:
    import platform

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {THREADS[0]} torch thread(s)"


SMOKE: list[str] = []  # train.py overrides of --smoke
THREADS = [1]  # torch threads of each training and evaluation (--threads)


def train(seed: int, pe: str) -> Path:
    """Train one encoding with train.py unless its run folder says it finished; return that folder."""
    name = f"{TASK}_{pe}_seed{seed}"
    out = RUNS / name / pe
    summary = out / "summary.json"
    if summary.exists() and json.loads(summary.read_text()).get("finished"):
        return out
    cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / f"{TASK}.yaml"),
           f"model.pe={pe}", "train.compare=[]", f"train.seed={seed}", f"train.threads={THREADS[0]}", "train.progress=false",
           "train.eval_sizes=[1.0]", f"train.out_dir={RUNS}", f"train.run_name={name}", *SMOKE]
    resume = ["--resume"] if (out / "checkpoint.pt").exists() else []
    print("+", " ".join(cmd[1:] + resume), flush=True)
    subprocess.run(cmd + resume, check=True, env={**os.environ, "OMP_NUM_THREADS": str(THREADS[0])})
    (out / "vispe-commit.txt").write_text(commit())
    return out


def evaluate(run: Path, variants: dict, datasets: dict) -> list[dict]:
    """The checkpoint of ``run`` at every size of SIZES under each variant's pe_kwargs."""
    import torch
    from omegaconf import OmegaConf

    from vispe.train import checkpoint as ckpt
    from vispe.train import config as C
    from vispe.train import engine, loaders
    from vispe.train.distributed import DistInfo
    from vispe.train.runner import build_data, build_model
    from vispe.train.tasks import get_task

    torch.set_num_threads(THREADS[0])
    state = ckpt.load(run / "checkpoint.pt")
    rows = []
    for variant, kw in variants.items():
        cfg = C.load_config(run / "config.yaml")
        cfg.train.eval_sizes = [1.0]
        base = OmegaConf.to_container(cfg.model.pe_kwargs) if cfg.model.pe_kwargs else {}
        cfg.model.pe_kwargs = OmegaConf.create({**base, **kw})
        task = get_task(cfg.task)
        if "data" not in datasets:
            datasets["data"] = build_data(task, cfg)
        data = datasets["data"]
        model = build_model(task, cfg, data)
        ckpt.check_compatible(state, model, OmegaConf.to_container(cfg, resolve=True), run / "checkpoint.pt")
        model.load_state_dict(state["model"])
        model.eval()
        for key, value in kw.items():  # the setting reached every layer's encoding
            pes = [m for m in model.modules() if hasattr(m, "family") and m.family == "rotary"]
            got = {getattr(p, key if key != "coords" else "liere_coords", None) for p in pes}
            want = tuple(value) if isinstance(value, list) else value
            if got != {want}:
                raise RuntimeError(f"{variant}: {key}={value!r} did not reach the encodings ({got})")
        for size in SIZES:
            if size not in datasets:
                n = cfg.data.test_subset
                if size[0] * size[1] > 64 * 64:  # 96 and 128 px: attention over 576-1024 tokens dominates the cost
                    n = min(n or BIG_SUBSET, BIG_SUBSET)
                datasets[size] = loaders.subset(task.dataset(cfg, "test", size), n)
            loader = loaders.eval_loader(datasets[size], batch_size=64, dist_info=DistInfo(), collate_fn=task.collate_fn)
            t = time.time()
            m = engine.evaluate(model, task, loader, device=torch.device("cpu"), amp_dtype=None)
            rows.append({"variant": variant or "as trained", "pe_kwargs": json.dumps(kw), "height": size[0],
                         "width": size[1], "test_samples": len(datasets[size]), "acc": round(m["acc"], 4),
                         "loss": round(m["loss"], 4),
                         "eval_s": round(time.time() - t, 1)})
        print(f"  {run.parent.name} {variant or 'as trained'}: " + "  ".join(
            f"{r['height']}x{r['width']} {r['acc']:.3f}" for r in rows if r["variant"] == (variant or "as trained")),
            flush=True)
    return rows


def _append(path: Path, rows: list[dict]):
    """Append ``rows`` to the CSV at ``path`` under a lock of its own (lanes write the same file)."""
    import fcntl

    import pandas as pd

    with open(path.with_suffix(".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        old = pd.read_csv(path) if path.exists() else None
        new = pd.DataFrame(rows)
        out = new if old is None else pd.concat([old, new], ignore_index=True)
        out.to_csv(path, index=False)  # after each run: a stop keeps the rest
    print("wrote", path, len(out), "rows", flush=True)


def run(seeds: list[int], encodings: list[str], lane: tuple[int, int] = (0, 1)) -> None:
    """Train and evaluate every (seed, encoding) not in the CSV yet; ``lane`` (i, n): only the units
    whose index is i mod n (n processes side by side, one thread each)."""
    import pandas as pd

    path = HERE / "data" / f"extrapolation_{TASK}.csv"
    old = pd.read_csv(path) if path.exists() else None
    datasets: dict = {}
    where = machine()
    units = [(seed, pe) for seed in seeds for pe in encodings]
    for seed, pe in units[lane[0]::lane[1]]:
        if old is not None and ((old.encoding == pe) & (old.seed == seed)).any():
            continue  # evaluated already
        with heavy_lock():  # one training and its evaluations at a time, between other engineers' jobs
            out = train(seed, pe)
            evaluated = evaluate(out, ENCODINGS[pe], datasets)
        s = json.loads((out / "summary.json").read_text())
        _append(path, [{"task": TASK, "encoding": pe, "seed": seed, **r, "train_acc": round(s["final"]["train_acc"], 4),
                        "train_time_s": s["train_time_s"], "device": where, "torch": s["torch"],
                        "commit": (out / "vispe-commit.txt").read_text().strip()} for r in evaluated])


# --- tables --------------------------------------------------------------------------------------
def _cell(values) -> str:
    import numpy as np

    v = np.asarray(values, dtype=float)
    return f"{v.mean():.3f}" + (f" ± {v.std(ddof=1):.3f}" if len(v) > 1 else "")


def table() -> str:
    import pandas as pd

    path = HERE / "data" / f"extrapolation_{TASK}.csv"
    if not path.exists():
        return "(no data yet)"
    df = pd.read_csv(path)
    sizes = [s for s in SIZES if ((df.height == s[0]) & (df.width == s[1])).any()]
    name = lambda h, w: f"{h}px" if h == w else f"{h}x{w}"  # noqa: E731
    head = "| encoding | variant | seeds | " + " | ".join(
        name(h, w) + (" (train)" if (h, w) == (32, 32) else "") for h, w in sizes) + " |"
    lines = [head, "|" + "---|" * (len(sizes) + 3)]
    for pe, variants in ENCODINGS.items():
        for variant in variants:
            d = df[(df.encoding == pe) & (df.variant == (variant or "as trained"))]
            if d.empty:
                continue
            cells = [_cell(d[(d.height == h) & (d.width == w)].acc) for h, w in sizes]
            lines.append(f"| {pe} | {variant or 'as trained'} | {d.seed.nunique()} | " + " | ".join(cells) + " |")
    runs = df.drop_duplicates(["encoding", "seed"])
    meta = (f"\nSeeds {sorted(df.seed.unique().tolist())}; trained at 32 px (8 x 8 tokens), train accuracy "
            f"{runs.train_acc.min():.3f}-{runs.train_acc.max():.3f}; training {runs.train_time_s.mean():.0f} s per run "
            f"on average; commit(s) {', '.join(f'`{c[:7]}`' for c in sorted(set(df.commit)))}; device: "
            f"{df.device.iloc[0]}; torch {df.torch.iloc[0]}.")
    return "\n".join(lines) + "\n" + meta


#: the papers' orderings, as (claim, encoding A as trained, encoding B as trained, sizes (H, W)):
#: A above B at those sizes (extrapolation.md gives the sources)
CLAIMS = [
    ("LookHere above 2D-RoPE far past the training size (LookHere: +21.7 at 1024 px from 224 px)",
     "lookhere", "rope_axial", [(64, 64), (128, 128)]),
    ("ComRoPE above LieRE at the training size (ComRoPE: +1.6)", "comrope", "liere", [(32, 32)]),
    ("ComRoPE above LieRE at higher sizes (ComRoPE: +2.9)", "comrope", "liere", [(48, 48), (64, 64), (128, 128)]),
    ("LieRE above RoPE-Mixed at higher sizes (LieRE: better resolution generalisation)", "liere", "rope_mixed",
     [(48, 48), (64, 64), (128, 128)]),
    ("LieRE above an absolute table, DeiT-III's (LieRE: up to +9.7% relative)", "liere", "learned_abs",
     [(32, 32), (48, 48), (64, 64), (128, 128)]),
    ("STRING above RoPE-Mixed at the training size (STRING, ImageNet)", "string", "rope_mixed", [(32, 32)]),
]


def claims() -> str:
    """Each claim's difference of means (A - B) per size, and in units of the seeds' spread (the
    pooled standard deviation, sqrt((s_A^2 + s_B^2) / 2))."""
    import numpy as np
    import pandas as pd

    path = HERE / "data" / f"extrapolation_{TASK}.csv"
    if not path.exists():
        return "(no data yet)"
    df = pd.read_csv(path)
    df = df[df.variant == "as trained"]
    lines = ["| the papers' ordering (A above B) | size | A | B | A - B | in seeds' spreads | agrees? |",
             "|---|---|---|---|---|---|---|"]
    for claim, a, b, sizes in CLAIMS:
        for h, w in sizes:
            va = df[(df.encoding == a) & (df.height == h) & (df.width == w)].acc.to_numpy()
            vb = df[(df.encoding == b) & (df.height == h) & (df.width == w)].acc.to_numpy()
            if len(va) < 2 or len(vb) < 2:
                continue
            diff = va.mean() - vb.mean()
            spread = float(np.sqrt((va.std(ddof=1) ** 2 + vb.std(ddof=1) ** 2) / 2))
            units = diff / spread if spread > 0 else (0.0 if diff == 0 else float("inf") * np.sign(diff))
            verdict = ("yes" if units >= 2 else "no: reversed" if units <= -2 else "tie (within 2 spreads)")
            lines.append(f"| {claim} | {h}px | {va.mean():.3f} | {vb.mean():.3f} | {diff:+.3f} | "
                         f"{units:+.1f} | {verdict} |")
    return "\n".join(lines)


def write_md() -> None:
    md = HERE / "extrapolation.md"
    text = md.read_text() if md.exists() else "# Resolution extrapolation (issue 38)\n"
    for key, body in ((f"extrapolation:{TASK}", table()), (f"claims:{TASK}", claims())):
        begin, end = f"<!-- BEGIN {key} -->", f"<!-- END {key} -->"
        if begin in text:
            pre, rest = text.split(begin, 1)
            text = pre + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]
        else:
            text += f"\n{begin}\n{body}\n{end}\n"
    md.write_text(text)
    print("wrote", md)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--encodings", default=",".join(ENCODINGS))
    p.add_argument("--report", action="store_true", help="only rewrite the table from the CSV")
    p.add_argument("--smoke", action="store_true", help="1 epoch on 256 samples, 64 test samples, under /tmp")
    p.add_argument("--lock", help="a file to flock around each training + evaluation (e.g. /work/heavy.lock)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per training and evaluation (1)")
    p.add_argument("--lane", default="0/1", help="i/n: this process runs units i, i + n, ... (n lanes side by side)")
    a = p.parse_args(argv)
    if a.lock:
        LOCK.append(a.lock)
    THREADS[0] = a.threads
    if a.smoke:
        global RUNS, HERE
        RUNS, HERE = Path("/tmp/vispe_extrapolation_smoke/runs"), Path("/tmp/vispe_extrapolation_smoke")
        (HERE / "data").mkdir(parents=True, exist_ok=True)
        SMOKE.extend(["train.epochs=1", "data.train_subset=256", "data.test_subset=64"])
    if not a.report:
        i, n = (int(v) for v in a.lane.split("/"))
        run([int(s) for s in a.seeds.split(",")], a.encodings.split(","), (i, n))
    write_md()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
