"""Training-step time with ``torch.compile`` against eager, per encoding and for the detector.

    python3 bootstrap.py bench/compile_step.py [--rounds 3] [--iters 2] [--encodings sine rope_axial ...] [--no-detr]
                                               [--warm-cache]

What ``train.py ... train.compile=true`` does: the model is compiled (``torch.compile(model)``,
default options), the loss, backward and AdamW update stay eager. For each model an eager copy and
a compiled copy with the same weights are timed side by side, interleaved round by round in a new
order each round (``bench._common.interleaved``); the figure is the median over rounds of the
compiled step's time divided by the eager step's time in the same round (< 1: compile is faster).

* ViT: digits_cell's model (``vit_pico``: width 64, depth 4, 4 heads, patch 4, MLP ratio 2), a
  batch of 32 images of 32x32 (8x8 tokens), for ``none`` and every registered encoding (default).
* DETR: configs/shapes_detr.yaml's detector (small CNN, DAB queries, BoxRPB, 2 + 2 layers, width
  128) on real training batches of the shapes set, which change size from batch to batch; one step
  = the task's loss (Hungarian matching included, eager) + backward + AdamW, over the same list of
  batches in every round. ``compiled`` uses the default options (sizes marked dynamic after the
  first size change), ``dynamic`` passes ``dynamic=True`` from the start.

Compile cost and recompiles, before timing: the seconds of the first compiled step, then of the
steps that follow at other sizes (ViT: an evaluation pass at 24 and 48 px as ``train.eval_sizes``,
then training at 32 px again), the number of graphs dynamo compiled in each phase
(``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: first compile, recompiles and graph
breaks all count) and the graph breaks among them (``counters["graph_break"]``; their reasons with
``TORCH_LOGS=graph_breaks``). The compile seconds are cold: Inductor's caches go to a fresh
directory for the run (``TORCHINDUCTOR_CACHE_DIR``, removed at the end) unless ``--warm-cache``
keeps the usual one, where an earlier compile of the same graph makes a later one look cheap.
"""
from __future__ import annotations

import argparse
import atexit
import copy
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if "--warm-cache" not in sys.argv and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # before torch is imported
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _COLD = tempfile.mkdtemp(prefix="vispe_compile_bench_")
    atexit.register(shutil.rmtree, _COLD, ignore_errors=True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch._dynamo.utils as dynamo_utils  # noqa: E402
from _common import compare_ops, interleaved, machine, ms, positive_args, ratio, spread, train_step  # noqa: E402  (before torch)

ROOT = Path(__file__).resolve().parents[1]


def raise_recompile_limit(n: int = 1024) -> None:
    """Every model here compiles the same ``VispeViT.forward``: past dynamo's recompile limit (8) it
    would silently run the rest eagerly (0 graphs, a ratio of 1 that measures nothing)."""
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, n)


def encodings() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from vispe.registry import available

    return ["none"] + [e for e in available() if e != "none"]


def graphs() -> int:
    return int(dynamo_utils.counters["stats"]["unique_graphs"])


def breaks() -> int:
    return int(sum(dynamo_utils.counters["graph_break"].values()))


def phase(fn) -> tuple[float, int, int]:
    """(seconds, graphs compiled, graph breaks) of one call of ``fn``."""
    g0, b0, t0 = graphs(), breaks(), time.perf_counter()
    fn()
    s, g, b = time.perf_counter() - t0, graphs() - g0, breaks() - b0
    print(f"  ... {s:.1f} s, {g} graphs, {b} breaks", file=sys.stderr, flush=True)  # progress: compiles take minutes
    return s, g, b


def vit_pair(pe: str, batch: int):
    """Eager and compiled step closures of one encoding, and the compile cost of the compiled one."""
    from vispe.models.vit import create_vit

    torch.manual_seed(0)
    eager = create_vit("vit_pico", pe=pe, img_size=32, patch_size=4, mlp_ratio=2.0, num_classes=9)
    comp_model = copy.deepcopy(eager)
    compiled = torch.compile(comp_model)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 9, (batch,))


    def evaluate(size):
        def run():
            comp_model.eval()
            with torch.no_grad():
                compiled(torch.randn(2 * batch, 3, size, size))
            comp_model.train()
        return run

    step_c = train_step(compiled, x, y)  # the compiled module trains comp_model's parameters
    cost = [("first step 32px", *phase(step_c)), ("second step 32px", *phase(step_c))]
    for size in (24, 48):
        cost.append((f"eval {size}px", *phase(evaluate(size))))
    cost.append(("step 32px again", *phase(step_c)))
    return train_step(eager, x, y), step_c, cost


def pad_to(batch, size: tuple[int, int]):
    """A detection batch padded (zeros, mask True) to ``size`` = (H, W)."""
    images, mask, targets = batch
    dh, dw = size[0] - images.shape[-2], size[1] - images.shape[-1]
    images = torch.nn.functional.pad(images, (0, dw, 0, dh))  # (B, 3, H, W)
    mask = torch.nn.functional.pad(mask, (0, dw, 0, dh), value=True)  # (B, H, W)
    return images, mask, targets  # boxes are normalised to each image's valid area: unchanged


DETR_VARIANTS = ("compiled", "dynamic", "fixed", "fixed+backbone", "fixed+aot_eager")


def detr_steps(n_batches: int, variants: list[str]):
    """Eager and compiled DETR steps over ``n_batches`` real training batches of configs/shapes_detr.yaml,
    and the compile costs. ``variants``: ``compiled`` (default options: sizes marked dynamic after the
    first size change), ``dynamic`` (``dynamic=True``), both on the batches as they come (sizes change);
    ``fixed`` (``dynamic=False``, every batch padded to the largest size among them; the backbone outside
    the graph, as by default), ``fixed+backbone`` (the same with ``model.backbone_in_graph = True``) and
    ``fixed+aot_eager`` (``fixed`` through AOT autograd with eager kernels, ``backend="aot_eager"``: what
    tracing and the joint graph cost without Inductor's code), each against an eager step on the same
    padded batches."""
    from vispe.train import loaders
    from vispe.train.config import load_config
    from vispe.train.distributed import DistInfo
    from vispe.train.runner import build_data, build_model
    from vispe.train.tasks import get_task

    cfg = load_config(ROOT / "configs/shapes_detr.yaml", ["train.device=cpu", "train.compare=[]"], smoke=True)
    task = get_task(cfg.task)
    data = build_data(task, cfg)
    torch.manual_seed(0)
    eager = build_model(task, cfg, data)
    loader = loaders.train_loader(data.train, batch_size=cfg.data.batch_size, epoch=0, skip_batches=0, seed=0,
                                  dist_info=DistInfo(), num_workers=0, collate_fn=task.collate_fn, pin_memory=False)
    batches = []
    for b in loader:
        batches.append(b)
        if len(batches) == n_batches:
            break
    sizes = sorted({tuple(b[0].shape[-2:]) for b in batches})
    big = (max(h for h, _ in sizes), max(w for _, w in sizes))
    padded = [pad_to(b, big) for b in batches]

    def stepper(model, data):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            for b in data:
                loss, _ = task.step(model, b, torch.device("cpu"))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return step

    fns, costs, base = {"detr eager": stepper(eager, batches)}, {}, {}
    if any(v.startswith("fixed") for v in variants):
        fns["detr eager, fixed size"] = stepper(eager, padded)
    for v in variants:
        model = copy.deepcopy(eager)
        if v == "fixed+backbone":
            model.backbone_in_graph = True
        name, kw, data_v = {"compiled": ("detr compiled", {}, batches),
                            "dynamic": ("detr dynamic", {"dynamic": True}, batches),
                            "fixed": ("detr compiled, fixed size", {"dynamic": False}, padded),
                            "fixed+backbone": ("detr compiled+backbone, fixed", {"dynamic": False}, padded),
                            "fixed+aot_eager": ("detr aot_eager, fixed", {"dynamic": False, "backend": "aot_eager"},
                                                padded)}[v]
        fn = stepper(torch.compile(model, **kw), data_v)
        print(f"compiling {name}", file=sys.stderr, flush=True)
        costs[name] = [(f"first pass, {len(batches)} batches", *phase(fn)), ("second pass", *phase(fn))]
        fns[name] = fn
        base[name] = "detr eager, fixed size" if v.startswith("fixed") else "detr eager"
    return fns, costs, sizes, big, base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2, help="steps per timed call (ViT); DETR: one pass over the batches")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--detr-batches", type=int, default=4)
    ap.add_argument("--encodings", nargs="*", default=None, help="default: none and every registered encoding")
    ap.add_argument("--warm-cache", action="store_true", help="keep Inductor's usual cache (compile seconds then "
                    "depend on what was compiled before)")
    ap.add_argument("--no-detr", action="store_true")
    ap.add_argument("--no-dynamic", action="store_true", help="skip DETR with dynamic=True")
    ap.add_argument("--profile", action="store_true", help="after timing, profile each compiled DETR variant "
                    "against its eager step op by op (where the compiled step's time goes)")
    ap.add_argument("--detr-variants", nargs="*", default=None, choices=DETR_VARIANTS,
                    help=f"compiled DETR variants (default: all of {', '.join(DETR_VARIANTS)}; "
                         "--no-dynamic drops dynamic)")
    args = ap.parse_args()
    positive_args(ap, args, "rounds", "iters", "batch", "detr_batches")
    args.encodings = encodings() if args.encodings is None else args.encodings
    raise_recompile_limit()
    print(f"# compiled vs eager training step; {machine()}")
    print(f"# Inductor cache: {'warm (the usual directory)' if args.warm_cache else 'cold (a fresh directory)'}")
    print(f"# command: python3 bootstrap.py bench/compile_step.py {' '.join(sys.argv[1:])}".rstrip())
    fns, costs = {}, {}
    for pe in args.encodings:
        print(f"compiling {pe}", file=sys.stderr, flush=True)
        eager, comp, cost = vit_pair(pe, args.batch)
        fns[f"{pe} eager"], fns[f"{pe} compiled"], costs[f"{pe} compiled"] = eager, comp, cost
    times = interleaved(fns, args.rounds, iters=args.iters, warmup=1) if fns else {}
    det_times, sizes, base = {}, [], {}
    if not args.no_detr:
        variants = list(DETR_VARIANTS if args.detr_variants is None else args.detr_variants)
        if args.no_dynamic and "dynamic" in variants:
            variants.remove("dynamic")
        dfns, dcosts, sizes, big, base = detr_steps(args.detr_batches, variants)
        costs.update(dcosts)
        det_times = interleaved(dfns, args.rounds, iters=1, warmup=1)
        if args.profile:
            for name, ref in base.items():
                compare_ops({"eager": dfns[ref], "compiled": dfns[name]}, f"{name} against {ref}")
    print("\n## compile cost (seconds of the call; graphs = new graphs dynamo compiled in it, breaks = graph breaks)")
    print(f"{'model':<30}{'call':<30}{'s':>8}{'graphs':>8}{'breaks':>8}")
    for name, rows in costs.items():
        for what, s, g, b in rows:
            print(f"{name:<30}{what:<30}{s:>8.1f}{g:>8d}{b:>8d}")
    print(f"\n## step time, median of {args.rounds} rounds (ViT: batch {args.batch}, 32x32; wall and CPU clocks)")
    print(f"{'model':<30}{'eager ms':>10}{'compiled ms':>13}{'ratio wall':>12}{'(quartiles)':>16}{'ratio cpu':>11}")
    for pe in args.encodings:
        c, e = f"{pe} compiled", f"{pe} eager"
        lo, hi = spread(times, c, e)
        print(f"{pe:<30}{ms(times, e):>10.1f}{ms(times, c):>13.1f}{ratio(times, c, e):>12.2f}"
              f"{f'{lo:.2f}-{hi:.2f}':>16}{ratio(times, c, e, 'cpu'):>11.2f}")
    for name, ref in base.items():
        lo, hi = spread(det_times, name, ref)
        print(f"{name:<30}{ms(det_times, ref):>10.1f}{ms(det_times, name):>13.1f}"
              f"{ratio(det_times, name, ref):>12.2f}{f'{lo:.2f}-{hi:.2f}':>16}"
              f"{ratio(det_times, name, ref, 'cpu'):>11.2f}")
    if det_times:
        print(f"(DETR: one pass over {args.detr_batches} training batches of sizes {sizes}, batch size 8; "
              f"'fixed': the same batches padded to {big}, against an eager step on them: "
              f"{ms(det_times, 'detr eager, fixed size'):.1f} ms)" if "detr eager, fixed size" in det_times else
              f"(DETR: one pass over {args.detr_batches} training batches of sizes {sizes}, batch size 8)")


if __name__ == "__main__":
    main()
