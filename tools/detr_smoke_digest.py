"""Bit-equality harness of the detector (issue 46): a few training steps of each smoke variant, printed
as exact loss trajectories and a SHA-256 of the final state_dict's bytes.

    python tools/detr_smoke_digest.py                 # print the digest as JSON
    python tools/detr_smoke_digest.py --check         # compare with tests/data/detr_compat/smoke_digest.json
    python tools/detr_smoke_digest.py --write         # record today's digest there

A refactor of ``vispe/models/detr/`` that is a pure move must leave every line equal to the last bit:
same modules in the same order draw the same initial weights, the same steps give the same losses
(``float.hex``) and the same final weights (the hash covers each tensor's name, dtype, shape and raw
bytes, so a sum that happens to agree is not enough). One thread, fixed seed, CPU.
tests/test_detr_smoke_digest.py reruns it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "data" / "detr_compat" / "smoke_digest.json"
STEPS = 3
#: name -> (config, overrides applied after the config's smoke variant)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "detr_dab_boxrpb": ("configs/shapes_detr.yaml", []),
    "detr_conditional": ("configs/shapes_detr.yaml", ["detr.decoder=conditional", "detr.box_bias=null"]),
    "deformable": ("configs/shapes_deformable_detr.yaml", []),
    "deformable_two_stage": ("configs/shapes_deformable_detr.yaml",
                             ["detr.decoder_kwargs={with_box_refine: true, two_stage: true}"]),
    "deformable_dab": ("configs/shapes_deformable_detr.yaml", ["detr.decoder=dab", "detr.num_queries=12"]),
    "dino": ("configs/shapes_dino.yaml", []),
}
#: every variant: small enough for a test, no evaluation sizes built, no run folder written
COMMON = ["train.eval_sizes=[1.0]", "data.train_subset=16", "data.test_subset=2", "data.batch_size=4",
          "train.device=cpu", "train.seed=0"]


def state_hash(model: torch.nn.Module) -> str:
    """SHA-256 over each state_dict entry's name, dtype, shape and bytes, in the state_dict's order."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def run_variant(config: str, overrides: list[str], steps: int = STEPS) -> dict:
    """``steps`` training steps of ``config``'s smoke variant: {"losses": [hex...], "state": sha256, "params": n}."""
    from vispe.train import config as C, loaders
    from vispe.train.distributed import DistInfo
    from vispe.train.runner import build_data, build_model, build_optimizer, seed_everything
    from vispe.train.tasks import get_task

    cfg = C.load_config(ROOT / config, [*COMMON, *overrides], smoke=True)
    task = get_task(cfg.task)
    seed_everything(cfg.train.seed)
    data = build_data(task, cfg)
    model = build_model(task, cfg, data)
    optimizer = build_optimizer(cfg, model, task)
    loader = loaders.train_loader(data.train, batch_size=cfg.data.batch_size, epoch=0, skip_batches=0,
                                  seed=cfg.train.seed, dist_info=DistInfo(), collate_fn=task.collate_fn)
    device = torch.device("cpu")
    losses = []
    model.train()
    for i, batch in enumerate(loader):
        if i == steps:
            break
        loss, _ = task.step(model, batch, device, train=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()).hex())
    return {"losses": losses, "state": state_hash(model), "params": sum(p.numel() for p in model.parameters())}


def digest(names=None) -> dict:
    torch.set_num_threads(1)
    return {name: run_variant(*VARIANTS[name]) for name in (names or VARIANTS)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help=f"compare with {RECORD.relative_to(ROOT)}")
    p.add_argument("--write", action="store_true", help=f"write {RECORD.relative_to(ROOT)}")
    args = p.parse_args(argv)
    d = digest()
    text = json.dumps(d, indent=1, sort_keys=True)
    print(text)
    if args.write:
        RECORD.write_text(text + "\n")
    if args.check:
        old = json.loads(RECORD.read_text())
        bad = [k for k in sorted(set(old) | set(d)) if old.get(k) != d.get(k)]
        print("digest equal" if not bad else f"digest DIFFERS: {bad}", file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
