"""Forward + backward time of vispe's whole deformable detector against transformers'
DeformableDetrForObjectDetection at the same config and weights, and the cost of a training step of
configs/shapes_deformable_detr.yaml against the single-scale DAB-DETR + BoxRPB of configs/shapes_detr_table3.yaml.

    flock /work/heavy.lock python3 bootstrap.py bench/deformable_detector.py [--rounds 5] [--part both]

Part 1 (``--part transformers``): transformers' detector from a ``DeformableDetrConfig`` (timm ResNet-50,
d_model 256, 8 heads, 6 + 6 layers, FFN 1024, 4 levels x 4 points, 300 queries; the plain and the
``with_box_refine`` + ``two_stage`` variants; random O(1) weights, nothing downloaded), vispe's loaded
from it with ``load_detr`` (outputs checked equal before timing); a batch of 2 images padded to 320 x 480
(the second 256 x 352 valid). One step: forward, a sum, backward: transformers' final logits and boxes
plus every decoder layer's hidden state (its auxiliary heads run only with labels, i.e. with its loss),
vispe's final and auxiliary logits and boxes (the heads are 0.1% of the work); two-stage: plus the
proposals' scores. Part 2 (``--part shapes``): a training step (forward, DETR's criterion,
backward) of the two shapes configs' models built by train.py's detection task, on the same batch of 8
shapes images. Timed interleaved in a new random order each round (``bench/_common.py``); printed: the
median over rounds of the per-round ratio, its quartiles, wall and CPU clocks.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import _common as C  # noqa: I001  (sets OMP_WAIT_POLICY before torch is imported)
import torch
from detr_step import freeze_like
from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection

from vispe.models.detr import load_detr

ROOT = Path(__file__).resolve().parents[1]


def perturb(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "running_var" in name:
                t.uniform_(0.5, 2.0)
            elif t.is_floating_point():
                t.normal_(0, 1.0 / t[0].numel() ** 0.5) if t.dim() > 1 else t.normal_(0, 0.1)
    return model


def transformers_part(args) -> dict:
    images = torch.randn(2, 3, 320, 480, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 320, 480, dtype=torch.bool)
    mask[1, 256:], mask[1, :, 352:] = True, True
    steps = {}
    for variant, kw in (("plain", {}), ("two-stage", dict(with_box_refine=True, two_stage=True))):
        cfg = DeformableDetrConfig(use_timm_backbone=True, backbone="resnet50", use_pretrained_backbone=False,
                                   d_model=256, encoder_layers=args.layers, decoder_layers=args.layers,
                                   encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=1024,
                                   decoder_ffn_dim=1024, num_queries=300, two_stage_num_proposals=300, dropout=0.0,
                                   num_labels=91, auxiliary_loss=True, **kw)
        hf = perturb(DeformableDetrForObjectDetection(cfg)).train()
        ours = load_detr(hf).train()
        freeze_like(hf, ours)  # the same trained parameters (transformers skips its stem/layer1 freeze for timm)
        with torch.no_grad():
            a = hf(pixel_values=images, pixel_mask=(~mask).long())
            b = ours(images, mask)
        diff = torch.maximum((a.logits - b["pred_logits"]).abs().amax(-1), (a.pred_boxes - b["pred_boxes"]).abs().amax(-1))
        print(f"{variant}: before timing, {int((diff < 1e-4).sum())} of {diff.numel()} queries agree to 1e-4 "
              f"(max |difference| {diff.min(-1).values.max():.1e} .. {diff.max():.1e}; two-stage: a top-k of close "
              f"proposal scores can pick another proposal at the boundary)")
        if variant == "two-stage":
            d = (a.enc_outputs_class - b["enc_outputs"]["pred_logits"]).abs().max()
            print(f"{variant}: proposal scores max |difference| {d:.1e}")

        def hf_step(hf=hf):
            out = hf(pixel_values=images, pixel_mask=(~mask).long())
            total = out.intermediate_hidden_states.sum() + out.logits.sum() + out.pred_boxes.sum()
            if out.enc_outputs_class is not None:
                total = total + out.enc_outputs_class.sum()
            total.backward()

        def vispe_step(ours=ours):
            out = ours(images, mask)
            total = sum(o["pred_logits"].sum() + o["pred_boxes"].sum() for o in [out, *out["aux_outputs"]])
            if "enc_outputs" in out:
                total = total + out["enc_outputs"]["pred_logits"].sum()
            total.backward()
        steps[f"{variant} transformers"], steps[f"{variant} vispe"] = hf_step, vispe_step
    return steps


def shapes_part(args) -> dict:
    from vispe.train import config as Cfg
    from vispe.train.tasks import get_task

    steps, samples = {}, None
    for name, path in (("single-scale DAB+BoxRPB", "configs/shapes_detr_table3.yaml"),
                       ("deformable (shapes config)", "configs/shapes_deformable_detr.yaml")):
        cfg = Cfg.load_config(ROOT / path, [])
        task = get_task(cfg.task)
        info = task.info(cfg)
        torch.manual_seed(0)
        model = task.model(cfg, info, 64).train()
        if samples is None:  # one batch for both (the training augmentation draws anew at every read)
            data = task.dataset(cfg, "train", 64)
            samples = [data[i] for i in range(8)]
        images, mask, targets = task.collate_fn(samples)
        crit = task.criterion

        def step(model=model, crit=crit, images=images, mask=mask, targets=targets):
            crit(model(images, mask), targets)["loss"].backward()
        steps[name] = step
        print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, batch {tuple(images.shape)}")
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--part", choices=("both", "transformers", "shapes"), default="both")
    args = ap.parse_args()
    C.positive_args(ap, args, "rounds", "layers")
    pairs, steps = [], {}
    if args.part in ("both", "shapes"):
        steps.update(shapes_part(args))
        pairs.append(("deformable (shapes config)", "single-scale DAB+BoxRPB"))
    if args.part in ("both", "transformers"):
        steps.update(transformers_part(args))
        pairs += [("plain vispe", "plain transformers"), ("two-stage vispe", "two-stage transformers")]
    times = C.interleaved(steps, args.rounds)
    print(f"# forward+backward; {args.rounds} interleaved rounds; {C.machine()}")
    for num, den in pairs:
        for clock in ("wall", "cpu"):
            lo, hi = C.spread(times, num, den, clock)
            print(f"{num} / {den} {clock:4s}: {C.ms(times, den, clock):8.1f} ms -> {C.ms(times, num, clock):8.1f} ms, "
                  f"ratio {C.ratio(times, num, den, clock):.3f} (quartiles {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
