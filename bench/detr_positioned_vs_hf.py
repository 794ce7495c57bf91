"""Forward + backward time of vispe's Conditional DETR and DAB-DETR against transformers' classes,
same config, same weights.

    python3 bootstrap.py bench/detr_positioned_vs_hf.py [--device cpu|cuda] [--rounds 9] [--iters 1]

transformers' ``ConditionalDetrForObjectDetection`` and ``DabDetrForObjectDetection`` are built from
configs (timm ResNet-18 backbone, random weights, nothing downloaded); ``load_detr`` builds vispe's
detectors from them (checked before timing: the outputs agree). Input: 2 images padded to 320 x 480
(the second 256 x 352 valid, so the padding mask matters). One step = forward + backward of the sum of
logits and boxes; both train the same parameters (the ResNet's layer2-4 and everything after it:
``freeze_like``). The four models are timed interleaved, in a new random order each round
(``bench/_common.py``); printed: the median over rounds of vispe's time / transformers' time of the
same design in the same round, with the quartiles of the per-round ratios, wall and CPU clocks.
"""
from __future__ import annotations

import argparse

import _common as C  # noqa: I001  (sets OMP_WAIT_POLICY before torch is imported)
import torch
from detr_step import freeze_like, inputs  # the same padded batch and trainable parameters as the DETR bench
from transformers import (
    ConditionalDetrConfig,
    ConditionalDetrForObjectDetection,
    DabDetrConfig,
    DabDetrForObjectDetection,
)

from vispe.models.detr import load_detr


def make_models(args) -> dict:
    torch.manual_seed(0)
    common = dict(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False,
                  encoder_layers=args.layers, decoder_layers=args.layers, encoder_attention_heads=8,
                  decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_queries=args.queries,
                  num_labels=91, dropout=0.0, attention_dropout=0.0)
    cond = ConditionalDetrForObjectDetection(ConditionalDetrConfig(d_model=args.d_model, **common))
    dab = DabDetrForObjectDetection(DabDetrConfig(hidden_size=args.d_model, **common))
    models = {}
    for name, hf in (("conditional", cond), ("dab", dab)):
        hf = hf.to(args.device).train()
        vispe = load_detr(hf).to(args.device).train()
        freeze_like(hf, vispe)
        models[f"{name} transformers"] = hf
        models[f"{name} vispe"] = vispe
    return models


def forward(model, images, mask):
    if isinstance(model, torch.nn.Module) and hasattr(model, "queries"):
        out = model(images, mask)
        return out["pred_logits"], out["pred_boxes"]
    out = model(pixel_values=images, pixel_mask=(~mask).long())
    return out.logits, out.pred_boxes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--profile", nargs="*", default=[], choices=("conditional", "dab"),
                    help="after timing, profile these designs op by op (transformers against vispe)")
    args = ap.parse_args()
    C.positive_args(ap, args, "rounds", "iters", "d_model", "layers", "queries")
    models = make_models(args)
    images, mask = inputs(args.device)
    for design in ("conditional", "dab"):
        with torch.no_grad():
            (a, b), (c, d) = (forward(models[f"{design} {who}"], images, mask) for who in ("transformers", "vispe"))
        print(f"{design}: max |output difference| before timing {max((a - c).abs().max(), (b - d).abs().max()):.2e}")

    def stepper(model):
        def step():
            logits, boxes = forward(model, images, mask)
            (logits.float().sum() + boxes.float().sum()).backward()
        return step

    sync = torch.cuda.synchronize if args.device == "cuda" else None
    times = C.interleaved({n: stepper(m) for n, m in models.items()}, args.rounds, args.iters, sync=sync)
    print(f"# forward+backward (ResNet-18, d_model {args.d_model}, {args.layers}+{args.layers} layers, "
          f"{args.queries} queries, batch 2, 320x480 padded), {args.rounds} interleaved rounds; {C.machine()}")
    for design in ("conditional", "dab"):
        v, h = f"{design} vispe", f"{design} transformers"
        for clock in ("wall", "cpu"):
            lo, hi = C.spread(times, v, h, clock)
            print(f"{design:12s} {clock:4s}: transformers {C.ms(times, h, clock):7.1f} ms, vispe {C.ms(times, v, clock):7.1f} ms,"
                  f" ratio vispe/transformers {C.ratio(times, v, h, clock):.3f} (quartiles {lo:.3f}-{hi:.3f})")
    for design in args.profile:
        C.compare_ops({who: stepper(models[f"{design} {who}"]) for who in ("transformers", "vispe")}, design)


if __name__ == "__main__":
    main()
