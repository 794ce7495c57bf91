"""A training step of vispe's RT-DETR against transformers' RTDetrForObjectDetection on the same config and weights.

    flock /tmp/vispe-heavy.lock python3 bootstrap.py bench/rtdetr_step.py [--rounds 7] [--steps 3] [--threads 1]

The config: RT-DETR's architecture at a CPU-sized width (ResNet-vd with bottleneck stages of 1/1/2/1 blocks,
hidden sizes 128..1024; hybrid encoder and decoder of width 128, 8 heads, FFN 512, 1 AIFI layer, 3 CSP
blocks, 6 decoder layers, 300 queries, 100 denoising queries, 80 classes). vispe's model is
``load_detr(hf)`` (equal outputs, ``tests/test_rtdetr.py``). One batch of 4 images at 320 x 320 with 1-6
random boxes each. One step = forward with the targets (denoising groups), the loss (transformers'
RTDetrLoss; vispe's RealtimeCriterion, equal values), backward, AdamW. The two models are timed
interleaved in a new random order each round (``bench/_common.py``). Printed: milliseconds per step of each
and the median over rounds of vispe / transformers in the same round (wall and CPU clocks), quartiles, the
machine. Target (issue 48): <= 1.0.
"""
from __future__ import annotations

import argparse

import _common as C  # noqa: I001  (sets OMP_WAIT_POLICY before torch is imported)
import torch


def build():
    from transformers import RTDetrConfig, RTDetrForObjectDetection

    from vispe.models.detr import load_detr
    from vispe.models.detr.realtime.criterion import RealtimeCriterion

    backbone = dict(model_type="rt_detr_resnet", embedding_size=32, hidden_sizes=[128, 256, 512, 1024],
                    depths=[1, 1, 2, 1], out_indices=[2, 3, 4])
    cfg = RTDetrConfig(backbone_config=backbone, encoder_in_channels=[256, 512, 1024], encoder_hidden_dim=128,
                       d_model=128, encoder_ffn_dim=512, decoder_ffn_dim=512, decoder_in_channels=[128, 128, 128],
                       num_labels=80)
    hf = RTDetrForObjectDetection(cfg).train()
    ours = load_detr(hf).train()
    return hf, ours, RealtimeCriterion(80)


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images, targets = torch.randn(4, 3, 320, 320, generator=g), []
    for _ in range(4):
        n = int(torch.randint(1, 7, (), generator=g))
        c, wh = torch.rand(n, 2, generator=g) * 0.5 + 0.25, torch.rand(n, 2, generator=g) * 0.3 + 0.1
        targets.append({"boxes": torch.cat([c, wh], -1), "labels": torch.randint(0, 80, (n,), generator=g)})
    return images, targets


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    C.positive_args(ap, args, "rounds", "steps", "threads")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf, ours, criterion = build()
    images, targets = batch()
    hf_labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    opt_hf, opt_ours = torch.optim.AdamW(hf.parameters(), lr=1e-5), torch.optim.AdamW(ours.parameters(), lr=1e-5)

    def run_hf():
        for _ in range(args.steps):
            loss = hf(pixel_values=images, labels=hf_labels).loss
            opt_hf.zero_grad(set_to_none=True)
            loss.backward()
            opt_hf.step()

    def run_ours():
        for _ in range(args.steps):
            loss = criterion(ours(images, targets=targets), targets)["loss"]
            opt_ours.zero_grad(set_to_none=True)
            loss.backward()
            opt_ours.step()

    times = C.interleaved({"transformers": run_hf, "vispe": run_ours}, args.rounds)
    print(f"machine: {C.machine()}; threads {args.threads}; {args.rounds} rounds of {args.steps} steps")
    for name in ("transformers", "vispe"):
        print(f"{name:12s} {C.ms(times, name) / args.steps:8.1f} ms/step wall, {C.ms(times, name, 'cpu') / args.steps:8.1f} cpu")
    for clock in ("wall", "cpu"):
        lo, hi = C.spread(times, "vispe", "transformers", clock)
        print(f"vispe / transformers ({clock}): {C.ratio(times, 'vispe', 'transformers', clock):.2f} (quartiles {lo:.2f}-{hi:.2f})")


if __name__ == "__main__":
    main()
