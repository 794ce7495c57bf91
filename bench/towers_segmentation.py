"""Forward time of the converted segmentation towers against transformers' originals (issue 50).

    python bench/towers_segmentation.py [--rounds 10] [--iters 2] [--batch 2] [--device cpu|cuda]

Two models, random weights, float32 on the CPU, eval mode, no grad, each at its native size and at
twice the tokens (the native grid doubled in width):

* EoMT-DINOv3 (transformers' ``EomtDinov3ForUniversalSegmentation``), ViT-S-sized: dim 384, 12
  layers, 6 heads, 4 register tokens, 100 queries in the last 4 layers, 2 upscale blocks, 224 px
  with patch 16 (14 x 14 patches). At 14 x 28 patches (224 x 448 px) the original is made to run by
  setting its head's ``grid_size`` (its RoPE is size-free).
* SAM 3's ViT (transformers' ``Sam3ViTModel``): dim 384, 8 layers, 6 heads, windows of 8 with two
  global layers, 448 px with patch 14 (32 x 32 patches), a 16 x 16 table tiled. At 32 x 64 patches
  the original is made to run by recomputing its global layers' position buffer for that grid.

Every model is timed in every round, round after round in one process (a new seeded order each
round); each figure is the median over rounds of the converted model's time divided by the
original's in the same round, in wall time [and the process's CPU time], with the quartiles of the
per-round ratios (bench/_common.py).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
from _common import interleaved, machine, ms, positive_args, ratio, spread  # noqa: E402

from vispe.models.vit import convert_vit  # noqa: E402

TARGET = 1.05  # converted / original at the native size


def eomt_dinov3():
    from transformers import EomtDinov3Config, EomtDinov3ForUniversalSegmentation

    cfg = EomtDinov3Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                           image_size=224, patch_size=16, num_register_tokens=4, num_queries=100, num_blocks=4,
                           num_upscale_blocks=2, num_labels=20)
    return EomtDinov3ForUniversalSegmentation(cfg).eval(), (224, 224), (224, 448)


def sam3_vit():
    from transformers import Sam3ViTConfig
    from transformers.models.sam3.modeling_sam3 import Sam3ViTModel

    cfg = Sam3ViTConfig(hidden_size=384, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=6,
                        image_size=448, patch_size=14, window_size=8, global_attn_indexes=[3, 7],
                        pretrain_image_size=224)
    return Sam3ViTModel(cfg).eval(), (448, 448), (448, 896)


def at_size(name: str, model, size):
    """The original made to run at ``size`` (module docstring); the model itself at its native size."""
    import copy

    model = copy.deepcopy(model)
    if name == "eomt_dinov3":
        model.grid_size = (size[0] // 16, size[1] // 16)
    else:
        h, w = size[0] // 14, size[1] // 14
        ws = model.config.window_size
        y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        for layer in model.layers:
            if not layer.window_size:
                layer.position_ids = torch.stack([x.flatten() * ws / w, y.flatten() * ws / h], dim=-1)
    return model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args(argv)
    positive_args(ap, args, "rounds", "iters", "batch")
    dev = args.device
    torch.manual_seed(0)
    fns, rows = {}, []
    for name, make in (("eomt_dinov3", eomt_dinov3), ("sam3_vit", sam3_vit)):
        model, native, double = make()
        converted = convert_vit(model).to(dev).eval()
        for label, size in (("native", native), ("2x tokens", double)):
            x = torch.randn(args.batch, 3, *size, device=dev)
            original = (model if size == native else at_size(name, model, size)).to(dev)
            with torch.no_grad():  # the two agree before they are timed
                a, b = original(x), converted(x)
                key = "masks_queries_logits" if name == "eomt_dinov3" else "last_hidden_state"
                diff = (a[key] - b[key]).abs().max().item()

            def run(m, x=x):
                with torch.no_grad():
                    m(x)
            fns[f"{name} {label} original"] = lambda m=original, run=run: run(m)
            fns[f"{name} {label} vispe"] = lambda m=converted, run=run: run(m)
            rows.append((name, label, size, diff))
    sync = torch.cuda.synchronize if dev == "cuda" else None
    times = interleaved(fns, args.rounds, args.iters, warmup=1, sync=sync)
    print(f"# forward (eval, no grad, batch {args.batch}), converted vispe model / transformers' original in the same "
          f"round; {args.rounds} interleaved rounds x {args.iters} calls")
    print(f"# {machine()}")
    print("| model | input | max abs diff | vispe / original, wall [cpu] | quartiles (wall) | original ms | vispe ms | "
          "target (native) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, label, size, diff in rows:
        v, o = f"{name} {label} vispe", f"{name} {label} original"
        r = ratio(times, v, o)
        lo, hi = spread(times, v, o)
        target = (f"<= {TARGET:.2f} " + ("met" if r <= TARGET else "NOT met")) if label == "native" else "-"
        print(f"| {name} | {label} {size[0]}x{size[1]} px | {diff:.1e} | {r:.3f} [{ratio(times, v, o, 'cpu'):.3f}] | "
              f"{lo:.2f}-{hi:.2f} | {ms(times, o):.0f} | {ms(times, v):.0f} | {target} |")


if __name__ == "__main__":
    main()
