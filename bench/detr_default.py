"""Where a training step of the detection default (configs/shapes_detr.yaml) spends its time.

    python3 bootstrap.py bench/detr_default.py [--rounds 3] [--steps 40] [--threads 1 2]

One step as ``train.py`` runs it, cut into its parts and timed each (wall clock, milliseconds per step):
``data`` (the next batch from the training loader in the main process: JPEG decoding, DETR's random
resize and crop, collation), ``forward`` (backbone, transformer, heads), ``loss`` (Hungarian matching
and the criterion), ``backward``, ``clip`` (gradient clipping) and ``optimiser`` (AdamW); then the
cost of one evaluation at the training size (200 validation images, COCOeval) and of its drawing of
predictions. Each thread count runs ``--steps`` steps per round, thread counts interleaved round by
round on one model (``torch.set_num_threads``); printed: the median over rounds of each part.
``OMP_WAIT_POLICY=PASSIVE`` as train.py (bench/_common.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _common as C  # noqa: I001  (sets OMP_WAIT_POLICY before torch is imported)
import torch

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("data", "forward", "loss", "backward", "clip", "optimiser")


def setup():
    from vispe.train import loaders
    from vispe.train.config import load_config
    from vispe.train.distributed import DistInfo
    from vispe.train.runner import build_data, build_model, build_optimizer
    from vispe.train.tasks import get_task

    cfg = load_config(ROOT / "configs/shapes_detr.yaml", ["train.device=cpu"])
    task = get_task(cfg.task)
    data = build_data(task, cfg)
    torch.manual_seed(0)
    model = build_model(task, cfg, data).train()
    opt = build_optimizer(cfg, model, task)

    def batches():
        epoch = 0
        while True:
            yield from loaders.train_loader(data.train, batch_size=cfg.data.batch_size, epoch=epoch, skip_batches=0,
                                            seed=0, dist_info=DistInfo(), num_workers=0, collate_fn=task.collate_fn)
            epoch += 1
    return cfg, task, data, model, opt, batches()


def timed_steps(task, model, opt, it, steps: int, clip: float) -> dict:
    t = dict.fromkeys(PARTS, 0.0)
    for _ in range(steps):
        t0 = time.perf_counter()
        images, mask, targets = next(it)
        t1 = time.perf_counter()
        out = model(images, mask)
        t2 = time.perf_counter()
        loss = task.criterion(out, targets)["loss"]
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t4 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        t5 = time.perf_counter()
        opt.step()
        t6 = time.perf_counter()
        for k, a, b in zip(PARTS, (t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6)):
            t[k] += (b - a) * 1000 / steps
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    C.positive_args(ap, args, "rounds", "steps")
    cfg, task, data, model, opt, it = setup()
    timed_steps(task, model, opt, it, 5, cfg.optim.grad_clip)  # warm-up
    runs = {n: [] for n in args.threads}
    for _ in range(args.rounds):
        for n in args.threads:
            torch.set_num_threads(n)
            runs[n].append(timed_steps(task, model, opt, it, args.steps, cfg.optim.grad_clip))
    torch.set_num_threads(args.threads[0])
    print(f"# a training step of configs/shapes_detr.yaml (batch {cfg.data.batch_size}, 64 px), ms per step, median "
          f"of {args.rounds} rounds x {args.steps} steps, thread counts interleaved; {C.machine()} (threads: per row)")
    print(f"# command: python3 bootstrap.py bench/detr_default.py {' '.join(sys.argv[1:])}".rstrip())
    print("| threads | " + " | ".join(PARTS) + " | step | epoch of 188 steps (s) |")
    print("|---" * (len(PARTS) + 3) + "|")
    for n, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in PARTS}
        step = statistics.median(sum(r.values()) for r in rs)
        print(f"| {n} | " + " | ".join(f"{med[k]:.1f}" for k in PARTS) + f" | {step:.1f} | {step * 188 / 1000:.1f} |")
    from vispe.train import engine, loaders
    from vispe.train.distributed import DistInfo

    loader = loaders.eval_loader(data.test, batch_size=2 * cfg.data.batch_size, dist_info=DistInfo(),
                                 collate_fn=task.collate_fn)
    t0 = time.perf_counter()
    engine.evaluate(model, task, loader, device=torch.device("cpu"), amp_dtype=None)
    t1 = time.perf_counter()
    task.visualize(model, data.test, Path("/tmp") / "vispe_bench_detr_default.png", torch.device("cpu"))
    t2 = time.perf_counter()
    print(f"\nevaluation at the training size ({len(data.test)} images, COCOeval; {args.threads[0]} thread): "
          f"{t1 - t0:.2f} s; drawing the predictions: {t2 - t1:.2f} s")
    seeding(data.train, args.rounds)


def seeding(train, rounds: int, n: int = 400) -> None:
    """Loading ``n`` training samples with each sample's generators seeded as now (the CPU generator)
    and as before issue 39 (``torch.manual_seed``, which also seeds CUDA lazily, recording a Python
    stack per call), interleaved, median of ``rounds``."""
    import numpy as np

    from vispe.train import loaders

    now = loaders._seed_all

    def before(s: int) -> None:
        torch.manual_seed(s)
        np.random.seed(s % 2**32)
        __import__("random").seed(s)

    ms = {"torch.manual_seed (before)": [], "the CPU generator (now)": []}
    for _ in range(rounds):
        for name, fn in zip(ms, (before, now)):
            loaders._seed_all = fn
            t = time.perf_counter()
            for i in range(n):
                train[i]
            ms[name].append((time.perf_counter() - t) * 1000 / n)
    loaders._seed_all = now
    print("loading a training sample (decode, DETR's augmentation), seeded with: " +
          "; ".join(f"{k} {statistics.median(v):.2f} ms" for k, v in ms.items()))


if __name__ == "__main__":
    main()
