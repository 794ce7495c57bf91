"""A training step of DINO (configs/shapes_dino.yaml) against two-stage Deformable DETR with box refinement
(configs/shapes_deformable_detr.yaml with two_stage) at the same budget and detector.

    flock /tmp/vispe-heavy.lock python3 bootstrap.py bench/dino_step.py [--rounds 7] [--steps 5] [--threads 1]

Both models are built by train.py's detection task from their configs (the shapes set's 5 classes, width
128, 4 levels, 12 queries; DINO with its 6 denoising groups); one batch of 8 shapes-set-sized images
(96 x 96, 1-4 random boxes each) is the input. One step = forward with the targets, criterion (Hungarian
matching, set, proposal and denoising losses), backward, AdamW; the models are timed interleaved in a new
random order each round (``bench/_common.py``). Printed: milliseconds per step of each and the median over
rounds of DINO / two-stage in the same round (wall and CPU clocks), quartiles, the machine.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import _common as C  # noqa: I001  (sets OMP_WAIT_POLICY before torch is imported)
import torch

ROOT = Path(__file__).resolve().parents[1]
TWO_STAGE = ["detr.decoder_kwargs={with_box_refine: true, two_stage: true}"]


def build(config: str, overrides: list[str]):
    from vispe.train import config as cfgs
    from vispe.train.tasks import get_task

    cfg = cfgs.load_config(ROOT / "configs" / config, overrides)
    task = get_task(cfg.task)
    model = task.model(cfg, task.info(cfg), 96).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return task, model, opt


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images, targets = torch.randn(8, 3, 96, 96, generator=g), []
    for _ in range(8):
        n = int(torch.randint(1, 5, (), generator=g))
        c, wh = torch.rand(n, 2, generator=g) * 0.5 + 0.25, torch.rand(n, 2, generator=g) * 0.3 + 0.1
        targets.append({"boxes": torch.cat([c, wh], -1), "labels": torch.randint(0, 5, (n,), generator=g)})
    return images, torch.zeros(8, 96, 96, dtype=torch.bool), targets


def step_fn(task, model, opt, data, steps):
    def run():
        for _ in range(steps):
            _, losses, _ = task._forward(model, data, "cpu")
            opt.zero_grad(set_to_none=True)
            losses["loss"].backward()
            opt.step()
    return run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    C.positive_args(ap, args, "rounds", "steps", "threads")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = batch()
    fns = {"two_stage": step_fn(*build("shapes_deformable_detr.yaml", TWO_STAGE), data, args.steps),
           "dino": step_fn(*build("shapes_dino.yaml", []), data, args.steps)}
    times = C.interleaved(fns, args.rounds)
    print(f"machine: {C.machine()}; threads {args.threads}; {args.rounds} rounds of {args.steps} steps")
    for name in fns:
        print(f"{name:10s} {C.ms(times, name) / args.steps:8.1f} ms/step wall, {C.ms(times, name, 'cpu') / args.steps:8.1f} cpu")
    for clock in ("wall", "cpu"):
        lo, hi = C.spread(times, "dino", "two_stage", clock)
        print(f"DINO / two-stage ({clock}): {C.ratio(times, 'dino', 'two_stage', clock):.2f} (quartiles {lo:.2f}-{hi:.2f})")


if __name__ == "__main__":
    main()
