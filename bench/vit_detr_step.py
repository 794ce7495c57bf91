"""A training step of vispe's RF-DETR-style detector against transformers' ``RfDetrForObjectDetection`` at the
same config (configs/shapes_rfdetr.yaml's detector: ViT width 64, 4 blocks, patch 8, 2 x 2 windows, table 8 x 8,
C2f at one scale, d_model 64, 2 decoder layers, 10 queries x 3 Group-DETR groups, 5 classes).

    flock /tmp/vispe-heavy.lock python3 bootstrap.py bench/vit_detr_step.py [--rounds 7] [--steps 5] [--threads 1]

vispe's model is transformers' loaded by ``load_detr`` (the same weights). One step = forward in training mode
(all groups), loss (transformers': its own ``LwDetr`` loss from ``labels``; vispe's: train.py's detection task's
criterion per group), backward, AdamW. One batch of 8 images of 64 x 96 (a native 2:3 aspect; transformers'
windows are scattered there, which changes no cost), 1-4 random boxes each. The two are timed interleaved in a
new random order each round (``bench/_common.py``). Printed: ms per step of each and the median over rounds of
vispe / transformers in the same round (wall and CPU clocks), quartiles, the machine.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import _common as C  # noqa: I001  (sets OMP_WAIT_POLICY before torch is imported)
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reference():
    from transformers import RfDetrConfig, RfDetrDinov2Config, RfDetrForObjectDetection

    bc = RfDetrDinov2Config(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, out_features=["stage2", "stage4"],
                            num_windows=2, image_size=64, patch_size=8, num_register_tokens=0)
    c = RfDetrConfig(backbone_config=bc, d_model=64, decoder_layers=2, decoder_self_attention_heads=4,
                     decoder_cross_attention_heads=4, decoder_ffn_dim=128, num_queries=10, group_detr=3, num_labels=5,
                     c2f_num_blocks=3, decoder_n_points=4, dropout=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RfDetrForObjectDetection(c).train()


def data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images, targets = torch.randn(8, 3, 64, 96, generator=g), []
    for _ in range(8):
        n = int(torch.randint(1, 5, (), generator=g))
        c, wh = torch.rand(n, 2, generator=g) * 0.5 + 0.25, torch.rand(n, 2, generator=g) * 0.3 + 0.1
        targets.append({"boxes": torch.cat([c, wh], -1), "labels": torch.randint(0, 5, (n,), generator=g)})
    return images, targets


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    C.positive_args(ap, args, "rounds", "steps", "threads")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from vispe.models.detr import HungarianMatcher, SetCriterion, load_detr

    hf = reference()
    ours = load_detr(hf).train()
    criterion = ours.wrap_criterion(SetCriterion(5, HungarianMatcher(2.0, 5.0, 2.0, focal_alpha=0.25, focal_gamma=2.0),
                                                 weight_ce=1.0, weight_bbox=5.0, weight_giou=2.0, focal_alpha=0.25,
                                                 focal_gamma=2.0))
    images, targets = data()
    labels = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    mask = torch.zeros(8, 64, 96, dtype=torch.bool)
    opt_hf, opt_ours = torch.optim.AdamW(hf.parameters(), lr=1e-4), torch.optim.AdamW(ours.parameters(), lr=1e-4)

    def run_hf():
        for _ in range(args.steps):
            loss = hf(pixel_values=images, labels=labels).loss
            opt_hf.zero_grad(set_to_none=True)
            loss.backward()
            opt_hf.step()

    def run_ours():
        for _ in range(args.steps):
            loss = criterion(ours(images, mask), targets)["loss"]
            opt_ours.zero_grad(set_to_none=True)
            loss.backward()
            opt_ours.step()

    fns = {"transformers": run_hf, "vispe": run_ours}
    times = C.interleaved(fns, args.rounds)
    print(f"machine: {C.machine()}; threads {args.threads}; {args.rounds} rounds of {args.steps} steps")
    for name in fns:
        print(f"{name:12s} {C.ms(times, name) / args.steps:8.1f} ms/step wall, {C.ms(times, name, 'cpu') / args.steps:8.1f} cpu")
    for clock in ("wall", "cpu"):
        lo, hi = C.spread(times, "vispe", "transformers", clock)
        print(f"vispe / transformers ({clock}): {C.ratio(times, 'vispe', 'transformers', clock):.2f} "
              f"(quartiles {lo:.2f}-{hi:.2f})")


if __name__ == "__main__":
    main()
