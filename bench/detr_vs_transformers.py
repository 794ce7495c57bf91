"""DETR forward + backward: vispe's detector against transformers' ``DetrForObjectDetection``.

    python bench/detr_vs_transformers.py [--backbone resnet50] [--size 320 480] [--batch 2] [--rounds 5]

transformers' model is built from a ``DetrConfig`` (DETR R50's architecture by default: d_model
256, 8 heads, 6 + 6 layers, FFN 2048, 100 queries; timm ResNet backbone, random weights, nothing
downloaded) and vispe's is ``vispe.models.detr.load_detr`` of it (the same weights; the outputs
are checked equal first). One timed call: training mode, forward on a padded batch (the second
image's right and bottom quarters are padding) and backward from the sum of the class logits and
boxes (the loss, with its Hungarian matching, is left out: it is not the model). Rounds
interleave the two; the ratio is the median over rounds of vispe's time over transformers' time
in the same round. The last lines give the attention kernel each of vispe's layers ran
(``vispe.kernels.explain``).
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
from _common import interleaved, machine, ms, ratio  # noqa: E402
import torch  # noqa: E402

from vispe.kernels.explain import explain  # noqa: E402
from vispe.models.detr import load_detr  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="resnet50")
    ap.add_argument("--size", type=int, nargs=2, default=[320, 480], help="image height and width")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import DetrConfig, DetrForObjectDetection

    torch.manual_seed(0)
    cfg = DetrConfig(use_timm_backbone=True, backbone=args.backbone, use_pretrained_backbone=False,
                     encoder_layers=args.layers, decoder_layers=args.layers, d_model=args.d_model, num_labels=91)
    hf = DetrForObjectDetection(cfg)
    ours = load_detr(hf)
    H, W = args.size
    images = torch.randn(args.batch, 3, H, W)
    mask = torch.zeros(args.batch, H, W, dtype=torch.bool)
    if args.batch > 1:
        mask[1, 3 * H // 4:] = True
        mask[1, :, 3 * W // 4:] = True
        images[1][:, mask[1]] = 0.0
    with torch.no_grad():
        ref = hf.eval()(pixel_values=images, pixel_mask=(~mask).long())
        got = ours.eval()(images, mask)
    diff = max((got["pred_logits"] - ref.logits).abs().max().item(), (got["pred_boxes"] - ref.pred_boxes).abs().max().item())
    hf.train()
    ours.train()

    def run_hf():
        out = hf(pixel_values=images, pixel_mask=(~mask).long())
        (out.logits.sum() + out.pred_boxes.sum()).backward()

    def run_ours():
        out = ours(images, mask)
        (out["pred_logits"].sum() + out["pred_boxes"].sum()).backward()

    times = interleaved({"transformers": run_hf, "vispe": run_ours}, args.rounds)
    print(f"# DETR ({args.backbone}, d_model {args.d_model}, {args.layers}+{args.layers} layers, 100 queries) forward + "
          f"backward, batch {args.batch} of {H}x{W} (padded), float32, training mode; {args.rounds} interleaved rounds")
    print(f"# {machine()}")
    print(f"# outputs in eval mode: largest difference vispe - transformers {diff:.2e}")
    print("| model | ms | ratio to transformers |")
    print("|---|---|---|")
    for n in ("transformers", "vispe"):
        print(f"| {n} | {ms(times, n):.0f} | {ratio(times, n, 'transformers'):.2f} |")
    rows = explain(ours, images, mask, backward=True)
    kernels = sorted({(r.kernel, ", ".join(r.backward)) for r in rows})
    print("# vispe attention kernels (forward; backward):", "; ".join(f"{k} ({b})" for k, b in kernels),
          f"in {len(rows)} layers")


if __name__ == "__main__":
    main()
