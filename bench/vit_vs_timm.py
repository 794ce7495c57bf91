"""ViT training-step time per encoding, vispe and timm side by side, as ratios to timm without position.

    python bench/vit_vs_timm.py [--rounds 5] [--iters 2] [--batch 64] [--device cpu|cuda]

The model is the CIFAR-sized ViT (32x32 images, patch 4: 64 tokens + class token, dim 192,
depth 6, 3 heads); one step = forward + backward + AdamW update, float32 on the CPU (bf16
autocast on CUDA). Every model is timed in every round, round after round in one process (in a
new seeded random order each round), and each figure is the median over rounds of that model's
step time divided by the step time of timm's ViT without position in the same round, in wall time
and in the process's CPU time (the steadier one on a shared machine, ``bench/_common.py``); the
quartiles of vispe's per-round ratios show the round-to-round spread.

timm's equivalents: ``VisionTransformer`` (``pos_embed='none'`` and ``'learn'``), ``Eva`` with
axial (``rope_type='cat'``) and mixed (``rope_type='mixed'``) RoPE and no absolute table, and
``VisionTransformerRelPos`` with ``rel_pos_type='bias'`` (Swin's table), all with a class token
pooled as the output, as vispe's model.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
from _common import interleaved, machine, ms, positive_args, ratio, spread, train_step  # noqa: E402

from vispe.models.vit import create_vit  # noqa: E402

COMMON = dict(img_size=32, patch_size=4, embed_dim=192, depth=6, num_heads=3, num_classes=10)
# (row, timm model or None, vispe encoding or None, target ratio of vispe to timm's `none`)
ROWS = [
    ("none", "vit_none", "none", None),
    ("learned_abs", "vit_learn", "learned_abs", 1.02),
    ("sine", None, "sine", 1.02),
    ("rope_axial", "eva_axial", "rope_axial", 1.05),
    ("rope_mixed", "eva_mixed", "rope_mixed", 1.08),
    ("relbias", "vit_relpos", "relbias", 1.05),
]


def vispe_model(pe: str) -> torch.nn.Module:
    """vispe's ViT of the same size as the timm rows, with encoding ``pe``."""
    return create_vit("vit_cifar", pe=pe, img_size=COMMON["img_size"], patch_size=COMMON["patch_size"],
                      num_classes=COMMON["num_classes"])


def timm_model(name: str) -> torch.nn.Module:
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    if name == "vit_none":
        return VisionTransformer(**COMMON, pos_embed="none")
    if name == "vit_learn":
        return VisionTransformer(**COMMON)
    if name in ("eva_axial", "eva_mixed"):
        return Eva(**COMMON, use_abs_pos_emb=False, use_rot_pos_emb=True, global_pool="token",
                   rope_type="cat" if name == "eva_axial" else "mixed")
    if name == "vit_relpos":
        return VisionTransformerRelPos(**COMMON, rel_pos_type="bias", class_token=True, global_pool="token")
    raise ValueError(f"timm model {name!r}: expected one of vit_none, vit_learn, eva_axial, eva_mixed, vit_relpos")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="the time the targets are checked on (the other is shown in brackets)")
    args = ap.parse_args(argv)
    positive_args(ap, args, "rounds", "iters", "batch")
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)

    def stepper(model):
        return train_step(model.to(dev).train(), x, y, bf16_autocast=dev == "cuda")

    fns = {}
    for row, timm_name, pe, _ in ROWS:
        if timm_name:
            fns[f"timm {row}"] = stepper(timm_model(timm_name))
        if pe:
            fns[f"vispe {row}"] = stepper(vispe_model(pe))
    sync = torch.cuda.synchronize if dev == "cuda" else None
    times = interleaved(fns, args.rounds, args.iters, warmup=2, sync=sync)
    base = "timm none"
    print(f"# ViT training step (32x32, patch 4, dim 192, depth 6, 3 heads, batch {args.batch}), "
          f"ratios to timm's ViT without position; {args.rounds} interleaved rounds x {args.iters} steps")
    print(f"# {machine()}")
    other = "cpu" if args.clock == "wall" else "wall"
    print(f"# each cell: median ratio in {args.clock} time [in {other} time]; vispe's quartiles over rounds "
          f"in {args.clock} time (round-to-round spread); timm none: {ms(times, base):.0f} ms/step (wall)")
    print("| encoding | timm model | timm ratio | vispe ratio | vispe quartiles | vispe / timm | target (vispe ratio) | vispe ms/step (wall) |")
    print("|---|---|---|---|---|---|---|---|")
    for row, timm_name, _pe, target in ROWS:
        def cell(name, base):
            if name is None:
                return "-", None
            r = ratio(times, name, base, args.clock)
            return f"{r:.2f} [{ratio(times, name, base, other):.2f}]", r
        t, _ = cell(f"timm {row}" if timm_name else None, base)
        v, vr = cell(f"vispe {row}", base)
        vt, _ = cell(f"vispe {row}" if timm_name else None, f"timm {row}")
        lo, hi = spread(times, f"vispe {row}", base, args.clock)
        tgt = "-" if target is None else f"<= {target:.2f} " + ("met" if vr <= target else "NOT met")
        print(f"| {row} | {timm_name or '-'} | {t} | {v} | {lo:.2f}-{hi:.2f} | {vt} | {tgt} | "
              f"{ms(times, f'vispe {row}'):.0f} |")


if __name__ == "__main__":
    main()
