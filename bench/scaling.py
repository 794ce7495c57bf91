"""Cost of every registered encoding as the token count grows: step time and peak memory, as
ratios to vispe's ViT without position, next to timm's equivalents.

    python bench/scaling.py [--tokens 64 256 1024 4096] [--encodings ...] [--modes train infer]
                            [--rounds 5] [--rounds-large 3] [--memory | --no-memory] [--json F] [--plot F]

The model: a ViT of width 192, depth 2, 3 heads (head_dim 64), patch 4, a class token, MLP ratio
4, float32, at grids 8x8 (64 tokens), 8x32 (256, non-square), 32x32 (1,024) and 64x64 (4,096),
with the batch chosen so that every step sees 4,096 tokens (64, 16, 4, 1 images): the linear
layers cost about the same at every size and the attention's N^2 part grows, which is where a
position encoding can cost more than its floor. ``train``: forward + cross-entropy + backward +
AdamW; ``infer``: forward in eval mode under ``torch.no_grad``.

Time: every model of one size and mode is timed in one process, round after round in a new
seeded order each round (``bench/_common.interleaved``); a cell is the median over rounds of the
model's time over vispe ``none``'s time in the same round, in wall time and in the process's CPU
time (steadier on a shared machine, but blind to work that runs on one thread while the other
waits: read both). Sizes with ``N >= 4096`` run ``--rounds-large`` rounds.

Memory (``--memory``, on by default): one subprocess per mode (fresh allocator state) builds each
model in turn, runs one warm-up step, then measures two ways (every model the first way, then every
model the second):

* ``rss``: the process's peak resident memory during one step (``VmHWM`` of /proc/self/status,
  reset before the step through /proc/self/clear_refs), minus its resident memory before the model
  was built: parameters, optimiser state, the encodings' cached tables (a relative index is
  held between steps) and everything the step allocates. glibc keeps freed memory for reuse and
  raises its mmap threshold as it goes, so the subprocess fixes ``MALLOC_MMAP_THRESHOLD_=65536``:
  every tensor beyond 64 KiB is then mapped and unmapped with its lifetime and the resident
  memory follows the tensors alive. This is the figure the targets are read on.
* ``alloc``: the highest sum of bytes allocated and not yet freed by torch's CPU allocator during
  one step (``torch.profiler`` memory events): activations, gradients and transients exactly,
  blind to what existed before the step (parameters, cached tables). tracemalloc sees none of
  this (torch's allocator is not Python's), and CPU builds of torch keep no allocator statistics.

Targets (issue 39), printed against the figures: rope_axial and rope_mixed at most 1.03 and every
bias encoding at most 1.2 of ``none``'s training step at 1,024 tokens, no worse at 4,096; the
peak memory of a bias encoding's training step at most 1.3x ``none``'s at 4,096 tokens.

timm's equivalents (same width, depth, heads, patch and class token, pooled on it):
``VisionTransformer`` without and with its learned table, ``Eva`` with axial (``rope_type='cat'``)
and mixed RoPE, ``VisionTransformerRelPos`` with Swin's table (``rel_pos_type='bias'``) and with
Swin-V2's log-spaced MLP (``'mlp'``). Each ratio is to vispe's ``none``, so vispe and timm read on
one scale; ``--json`` keeps every number, ``--plot`` draws the ratios against tokens (log x).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
from _common import cpu_alloc_peak, interleaved, machine, ms, positive_args, ratio, spread, train_step  # noqa: E402
from _scaling_plot import plot  # noqa: E402

GRIDS = {64: (8, 8), 256: (8, 32), 1024: (32, 32), 4096: (64, 64)}
TOKENS_PER_STEP = 4096
WIDTH, DEPTH, HEADS, PATCH = 192, 2, 3, 4
# vispe encoding -> timm's equivalent (a name of timm_model) where one exists
TIMM = {"none": "vit_none", "learned_abs": "vit_learn", "rope_axial": "eva_axial", "rope_mixed": "eva_mixed",
        "relbias": "vit_relpos", "log_cpb": "vit_relpos_mlp"}
TARGETS_TIME = {"rope_axial": 1.03, "rope_mixed": 1.03}  # bias family: 1.2 (targets())
TARGET_BIAS_TIME, TARGET_BIAS_MEMORY = 1.2, 1.3


def encodings() -> list[str]:
    from vispe.registry import available

    return ["none"] + [e for e in available() if e != "none"]


def family(pe: str) -> str:
    from vispe.registry import family_of

    return family_of(pe)


def time_target(pe: str) -> float | None:
    return TARGETS_TIME.get(pe, TARGET_BIAS_TIME if family(pe) == "bias" else None)


def batch_for(tokens: int) -> int:
    return max(1, TOKENS_PER_STEP // tokens)


def vispe_model(pe: str, grid) -> torch.nn.Module:
    from vispe.models.vit import create_vit

    return create_vit("vit_cifar", pe=pe, img_size=(PATCH * grid[0], PATCH * grid[1]), patch_size=PATCH,
                      embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS, num_classes=10)


def timm_model(name: str, grid) -> torch.nn.Module:
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    common = dict(img_size=(PATCH * grid[0], PATCH * grid[1]), patch_size=PATCH, embed_dim=WIDTH, depth=DEPTH,
                  num_heads=HEADS, num_classes=10)
    if name == "vit_none":
        return VisionTransformer(**common, pos_embed="none")
    if name == "vit_learn":
        return VisionTransformer(**common)
    if name in ("eva_axial", "eva_mixed"):
        return Eva(**common, use_abs_pos_emb=False, use_rot_pos_emb=True, global_pool="token",
                   rope_type="cat" if name == "eva_axial" else "mixed")
    if name in ("vit_relpos", "vit_relpos_mlp"):
        return VisionTransformerRelPos(**common, rel_pos_type="bias" if name == "vit_relpos" else "mlp",
                                       class_token=True, global_pool="token")
    raise ValueError(f"timm model {name!r}: expected one of {', '.join(sorted(set(TIMM.values())))}")


def rows_for(encs: list[str], with_timm: bool) -> list[str]:
    """Row names: ``vispe <encoding>`` and, where timm has one, ``timm <encoding>``."""
    rows = []
    for pe in encs:
        rows.append(f"vispe {pe}")
        if with_timm and pe in TIMM:
            rows.append(f"timm {pe}")
    return rows


IMPLS: dict = {}  # set_impl(**IMPLS) on every vispe model (--rope-impl, --bias-impl)


def build(row: str, grid) -> torch.nn.Module:
    lib, pe = row.split(" ", 1)
    torch.manual_seed(0)
    if lib != "vispe":
        return timm_model(TIMM[pe], grid)
    model = vispe_model(pe, grid)
    if IMPLS:
        from vispe.kernels import set_impl

        set_impl(model, **IMPLS)
    return model


def runner(model: torch.nn.Module, mode: str, x: torch.Tensor, y: torch.Tensor):
    """One call = one training step (forward, loss, backward, AdamW) or one inference forward."""
    if mode == "infer":
        model.eval()

        def infer():
            with torch.no_grad():
                model(x)
        return infer
    model.train()
    return train_step(model, x, y)


def inputs(tokens: int):
    h, w = GRIDS[tokens]
    g = torch.Generator().manual_seed(0)
    B = batch_for(tokens)
    return torch.randn(B, 3, PATCH * h, PATCH * w, generator=g), torch.randint(0, 10, (B,), generator=g)


# --- memory (run in a subprocess: python bench/scaling.py --memory-worker MODE ...) --------------------
def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return 1024 * int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size (Linux >= 4.0)




def memory_worker(mode: str, tokens: list[int], rows: list[str]) -> None:
    """Print one JSON line per (tokens, row) and measure ("rss" then "alloc", bytes; module docstring).

    Every resident-memory measurement comes before the first profiled one: memory the profiler
    allocated and freed stayed in the process and was reused by the next models' steps (a step's
    resident growth then read 25 MB where it is 128)."""
    warm = runner(build("vispe none", GRIDS[64]), mode, *inputs(64))  # thread pools, oneDNN caches
    warm(), warm()
    del warm
    for measure in ("rss", "alloc"):
        for n in tokens:
            x, y = inputs(n)
            for row in rows:
                gc.collect()
                base = _status("VmRSS")
                fn = runner(build(row, GRIDS[n]), mode, x, y)
                fn()  # warm-up: gradients, optimiser state, cached tables
                gc.collect()
                if measure == "rss":
                    _reset_peak()
                    fn()
                    value = _status("VmHWM") - base
                else:
                    value = cpu_alloc_peak(fn)
                print(json.dumps({"mode": mode, "tokens": n, "row": row, measure: value}), flush=True)
                del fn
    gc.collect()


def measure_memory(mode: str, tokens: list[int], rows: list[str], threads: int | None) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=ROOT)
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", mode, "--tokens", *map(str, tokens),
           "--rows", *rows] + (["--threads", str(threads)] if threads else [])
    cmd += [a for k, v in IMPLS.items() for a in (f"--{k}-impl", v)]
    print(f"memory ({mode}) in a subprocess ...", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            res.setdefault((r["tokens"], r["row"]), {}).update({k: r[k] for k in ("rss", "alloc") if k in r})
    return {key: (v["rss"], v["alloc"]) for key, v in res.items()}


# --- report -----------------------------------------------------------------------------------------
def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def verdict(v: float | None, target: float | None, cpu: float | None = None) -> str:
    if target is None or v is None:
        return ""
    word = lambda x: "met" if x <= target else "NOT met"  # noqa: E731
    return f"<= {target:g}: {word(v)}" + ("" if cpu is None else f" in wall time, {word(cpu)} in CPU time")


def report(res: dict, encs: list[str], tokens: list[int], modes: list[str], with_timm: bool) -> None:
    for mode in modes:
        t = res["time"].get(mode, {})
        if not t:
            continue
        print(f"\n## {mode}: time / vispe none's (median over rounds; wall [CPU])\n")
        head = " | ".join(f"{n} tok ({GRIDS[n][0]}x{GRIDS[n][1]}, batch {batch_for(n)})" for n in tokens)
        print(f"| encoding | {head} | timm's equivalent at {' / '.join(map(str, tokens))} |")
        print("|---|" + "---|" * len(tokens) + "---|")
        for pe in encs:
            cells = []
            for n in tokens:
                c = t.get(str(n), {}).get(f"vispe {pe}")
                cells.append("-" if c is None else f"{c['wall']:.2f} [{c['cpu']:.2f}]")
            tcells = []
            for n in tokens:
                c = t.get(str(n), {}).get(f"timm {pe}")
                tcells.append("-" if c is None else f"{c['wall']:.2f} [{c['cpu']:.2f}]")
            timm = f"{TIMM[pe]}: " + " / ".join(tcells) if with_timm and pe in TIMM else "-"
            print(f"| {pe} | " + " | ".join(cells) + f" | {timm} |")
        base = " / ".join(f"{t[str(n)]['vispe none']['ms']:.0f}" for n in tokens if str(n) in t)
        print(f"\nvispe none, ms per call (wall) at {' / '.join(map(str, tokens))} tokens: {base}")
        m = res["memory"].get(mode, {})
        if m:
            print(f"\n## {mode}: peak memory / vispe none's: rss [alloc] (MiB of vispe none below)\n")
            print(f"| encoding | {' | '.join(f'{n} tok' for n in tokens)} | timm's equivalent |")
            print("|---|" + "---|" * len(tokens) + "---|")
            for pe in encs:
                cells, tcells = [], []
                for n in tokens:
                    for lib, out in (("vispe", cells), ("timm", tcells)):
                        c = m.get(str(n), {}).get(f"{lib} {pe}")
                        out.append("-" if c is None else f"{c['rss']:.2f} [{c['alloc']:.2f}]")
                timm = f"{TIMM[pe]}: " + " / ".join(tcells) if with_timm and pe in TIMM else "-"
                print(f"| {pe} | " + " | ".join(cells) + f" | {timm} |")
            mib = " / ".join(f"{m[str(n)]['vispe none']['rss_mib']:.0f} [{m[str(n)]['vispe none']['alloc_mib']:.0f}]"
                             for n in tokens if str(n) in m)
            print(f"\nvispe none, MiB rss [alloc] at {' / '.join(map(str, tokens))} tokens: {mib}")
    print("\n## targets (issue 39; wall time, CPU time in brackets)\n")
    tt = res["time"].get("train", {})
    mm = res["memory"].get("train", {})
    for pe in encs:
        target = time_target(pe)
        if target is None:
            continue
        for n in (1024, 4096):
            c = tt.get(str(n), {}).get(f"vispe {pe}")
            if c:
                print(f"- {pe} train time at {n} tokens: {c['wall']:.2f} [{c['cpu']:.2f}] (wall quartiles "
                      f"{c['q1']:.2f}-{c['q3']:.2f}) {verdict(c['wall'], target, c['cpu'])}")
        c = mm.get("4096", {}).get(f"vispe {pe}")
        if c and family(pe) == "bias":
            print(f"- {pe} train peak memory at 4096 tokens: {c['rss']:.2f} rss [{c['alloc']:.2f} alloc] "
                  f"{verdict(c['rss'], TARGET_BIAS_MEMORY)}")


def commit() -> str:
    def git(*a):
        return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    if not head:  # a copy of the tree outside git (git archive): the commit it was taken at, if given
        return os.environ.get("VISPE_COMMIT", "unknown (not a git checkout)")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "vispe", "bench")
    return head + (" + uncommitted changes to vispe/ or bench/" if dirty else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="*", default=list(GRIDS), choices=list(GRIDS))
    ap.add_argument("--encodings", nargs="*", default=None, help="vispe names (default: every registered one)")
    ap.add_argument("--modes", nargs="*", default=["train", "infer"], choices=["train", "infer"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rounds-large", type=int, default=3, help="rounds at 4,096 tokens")
    ap.add_argument("--no-timm", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rope-impl", default=None, help="vispe.kernels.set_impl(rope=...) on every vispe model")
    ap.add_argument("--bias-impl", default=None, help="vispe.kernels.set_impl(bias=...) on every vispe model")
    ap.add_argument("--json", default=None, help="write every figure here")
    ap.add_argument("--plot", default=None, help="write the ratio-vs-tokens figure here (PNG)")
    ap.add_argument("--plot-clock", default="wall", choices=["wall", "cpu"], help="the time the figure shows")
    ap.add_argument("--replot", default=None, metavar="JSON", help="only redraw --plot (and reprint the tables) "
                    "from a --json file of an earlier run")
    ap.add_argument("--memory-worker", default=None, choices=["train", "infer"], help=argparse.SUPPRESS)
    ap.add_argument("--rows", nargs="*", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    positive_args(ap, args, "rounds", "rounds_large")
    if args.threads:
        torch.set_num_threads(args.threads)
    IMPLS.update({k: v for k, v in (("rope", args.rope_impl), ("bias", args.bias_impl)) if v})
    if args.memory_worker:
        memory_worker(args.memory_worker, args.tokens, args.rows)
        return
    if args.replot:
        with open(args.replot) as f:
            res = json.load(f)
        encs = [r.split(" ", 1)[1] for r in next(iter(next(iter(res["time"].values())).values())) if r.startswith("vispe ")]
        tokens = [int(n) for n in next(iter(res["time"].values()))]
        modes = [m for m in ("train", "infer") if res["time"].get(m)]
        title = (f"ViT width {WIDTH}, depth {DEPTH}, {HEADS} heads, patch {PATCH}, {TOKENS_PER_STEP} tokens per step; "
                 f"commit {res['commit']}\n{res['machine']}")
        print(f"# {res['machine']}\n# command: {res['command']}")
        report(res, encs, tokens, modes, any(r.startswith("timm ") for c in res["time"].values() for r in next(iter(c.values()))))
        if args.plot:
            plot(res, encs, tokens, modes, args.plot, title, family=family, timm_names=TIMM, clock=args.plot_clock)
        return
    all_encs = encodings()
    encs = args.encodings or all_encs
    bad = [e for e in encs if e not in all_encs]
    if bad:
        ap.error(f"--encodings {' '.join(bad)}: expected registered names ({', '.join(all_encs)})")
    if "none" not in encs:
        encs = ["none"] + encs
    rows = rows_for(encs, not args.no_timm)
    res = {"machine": machine(), "commit": commit(), "command": "python bench/scaling.py " + " ".join(sys.argv[1:]),
           "time": {}, "memory": {}}
    for mode in args.modes:
        res["time"][mode] = {}
        for n in args.tokens:
            x, y = inputs(n)
            print(f"timing {mode} at {n} tokens ({len(rows)} models) ...", file=sys.stderr, flush=True)
            fns = {row: runner(build(row, GRIDS[n]), mode, x, y) for row in rows}
            rounds = args.rounds if n < 4096 else args.rounds_large
            times = interleaved(fns, rounds, iters=1, warmup=1)
            del fns
            gc.collect()
            cell = {}
            for row in rows:
                lo, hi = spread(times, row, "vispe none")
                cell[row] = {"wall": ratio(times, row, "vispe none"), "cpu": ratio(times, row, "vispe none", "cpu"),
                             "q1": lo, "q3": hi, "ms": ms(times, row)}
            res["time"][mode][str(n)] = cell
        if not args.no_memory:
            mem = measure_memory(mode, args.tokens, rows, args.threads)
            res["memory"][mode] = {}
            for n in args.tokens:
                b_rss, b_alloc = mem[(n, "vispe none")]
                res["memory"][mode][str(n)] = {
                    row: {"rss": mem[(n, row)][0] / b_rss, "alloc": mem[(n, row)][1] / max(b_alloc, 1),
                          "rss_mib": mem[(n, row)][0] / 2**20, "alloc_mib": mem[(n, row)][1] / 2**20}
                    for row in rows}
    title = (f"ViT width {WIDTH}, depth {DEPTH}, {HEADS} heads, patch {PATCH}, {TOKENS_PER_STEP} tokens per step; "
             f"commit {res['commit']}\n{res['machine']}")
    print(f"# {title.splitlines()[0]}")
    print(f"# {res['machine']}")
    print(f"# command: {res['command']}")
    print(f"# rounds: {args.rounds} ({args.rounds_large} at 4,096 tokens); rows interleaved per size and mode")
    report(res, encs, args.tokens, args.modes, not args.no_timm)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    if args.plot:
        plot(res, encs, args.tokens, args.modes, args.plot, title, family=family, timm_names=TIMM, clock=args.plot_clock)


if __name__ == "__main__":
    main()
