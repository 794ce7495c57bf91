"""Forward + backward time of vispe's DETR against transformers' DETR, same config, same weights.

    python3 bootstrap.py bench/detr_step.py [--device cpu|cuda] [--rounds 5] [--iters 2]

transformers' ``DetrForObjectDetection`` is built from a ``DetrConfig`` (timm ResNet-18 backbone,
random weights, nothing downloaded); ``load_detr`` builds vispe's detector from it, so both hold
the same weights (checked: the outputs agree before timing). Input: a batch of 2 images padded to
320 x 480 (the second is 256 x 352 valid, so the padding mask matters). One step = forward +
backward of the sum of the logits and boxes (the loss is the same cheap reduction for both, so
the time is the model's); both train the same parameters (the ResNet's stem and layer1 frozen in
transformers' model too, as DETR and vispe do: ``freeze_like``). The models are timed side by side, interleaved round by round; the
printed figure is the median over rounds of vispe's time divided by transformers' time.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
from transformers import DetrConfig, DetrForObjectDetection

from vispe.models.detr import load_detr


def make_models(args):
    torch.manual_seed(0)
    cfg = DetrConfig(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False,
                     d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
                     encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                     decoder_ffn_dim=2048, num_queries=100, num_labels=91, dropout=0.0, attention_dropout=0.0)
    hf = DetrForObjectDetection(cfg).to(args.device).train()
    ours = load_detr(hf).to(args.device).train()
    freeze_like(hf, ours)
    return hf, ours


def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def freeze_like(hf, vispe) -> None:
    """Freeze the ResNet's stem and layer1 in transformers' model, as vispe's DETR backbone does (DETR's
    recipe: layer2-4 trained). transformers freezes them only when its backbone config's model type is
    "resnet", which a timm backbone's is not, so without this its backward would also run through the
    stem and layer1 (5 more convolution backwards, about 8% of its step at the papers' size: a ratio
    that flattered vispe by that much). Checked: both then train the same number of parameters."""
    for n, p in hf.named_parameters():
        if ".backbone." in n and not any(f".{k}." in n for k in ("layer2", "layer3", "layer4")):
            p.requires_grad_(False)
    if trainable(hf) != trainable(vispe):
        raise RuntimeError(f"trainable parameters differ: transformers {trainable(hf)}, vispe {trainable(vispe)}")


def inputs(device):
    torch.manual_seed(1)
    images = torch.randn(2, 3, 320, 480, device=device)
    mask = torch.zeros(2, 320, 480, dtype=torch.bool, device=device)
    mask[1, 256:] = True
    mask[1, :, 352:] = True
    images[1][:, mask[1]] = 0
    return images, mask


def step(run, iters: int, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        logits, boxes = run()
        (logits.float().sum() + boxes.float().sum()).backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    args = ap.parse_args()
    hf, ours = make_models(args)
    images, mask = inputs(args.device)

    def run_hf():
        out = hf(pixel_values=images, pixel_mask=(~mask).long())
        return out.logits, out.pred_boxes

    def run_ours():
        out = ours(images, mask)
        return out["pred_logits"], out["pred_boxes"]

    with torch.no_grad():
        (a, b), (c, d) = run_hf(), run_ours()
    err = max((a - c).abs().max().item(), (b - d).abs().max().item())
    step(run_hf, 1, args.device), step(run_ours, 1, args.device)  # warm-up
    t_hf, t_ours = [], []
    for r in range(args.rounds):  # alternate which goes first
        for name in (("hf", "ours") if r % 2 == 0 else ("ours", "hf")):
            (t_hf if name == "hf" else t_ours).append(step(run_hf if name == "hf" else run_ours, args.iters, args.device))
    ratios = [o / h for o, h in zip(t_ours, t_hf)]
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{platform.machine()} CPU, {torch.get_num_threads()} threads"
    print(f"# DETR forward+backward (ResNet-18, d_model {args.d_model}, {args.layers}+{args.layers} layers, 100 queries, "
          f"batch 2, 320x480 padded) on {where}; torch {torch.__version__}")
    print(f"max |output difference| before timing: {err:.2e}")
    print(f"transformers  {statistics.median(t_hf) * 1e3:8.1f} ms/step")
    print(f"vispe         {statistics.median(t_ours) * 1e3:8.1f} ms/step")
    print(f"ratio vispe / transformers: median {statistics.median(ratios):.3f} "
          f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
