"""Forward + backward time of vispe's deformable encoder and decoder layers against transformers'
Deformable DETR classes, same config, same weights.

    flock /work/heavy.lock python3 bootstrap.py bench/deformable_step.py [--rounds 7] [--layers 6]

transformers' ``DeformableDetrEncoder`` and a stack of ``DeformableDetrDecoderLayer`` are built from a
``DeformableDetrConfig`` (d_model 256, 8 heads, 4 levels, 4 points, FFN 1024, random weights, nothing
downloaded); vispe's ``DeformableEncoder`` / ``DeformableDecoderLayer`` load their weights through
``deformable_keys`` (checked before timing: the outputs agree). Input: the levels of a batch of 2
images padded to 320 x 480 (the second 256 x 352 valid) at strides 8-64 (40x60, 20x30, 10x15, 5x8:
3,190 tokens), the encoder's tokens and code random; the decoder: 300 queries with box reference
points (the refinement variants'), memory = the tokens. One step = forward + backward of the sum of
the output. All models are
timed interleaved, in a new random order each round (``bench/_common.py``); printed: the median over
rounds of vispe's time / transformers' time in the same round, quartiles, wall and CPU clocks.
"""
from __future__ import annotations

import argparse

import _common as C  # noqa: I001  (sets OMP_WAIT_POLICY before torch is imported)
import torch
from torch import nn
from transformers import DeformableDetrConfig
from transformers.models.deformable_detr.modeling_deformable_detr import (
    DeformableDetrDecoderLayer,
    DeformableDetrEncoder,
)

from vispe.coords import points_at_levels, resize_mask, valid_ratios
from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.load.deformable_keys import deformable_keys
from vispe.models.detr.transformer.deformable_decoder import DeformableDecoderLayer
from vispe.models.detr.transformer.deformable_encoder import DeformableEncoder


def inputs(args):
    pix = torch.zeros(2, 320, 480, dtype=torch.bool)
    pix[1, 256:] = True
    pix[1, :, 352:] = True
    masks = [resize_mask(pix, (-(-320 // s), -(-480 // s))) for s in (8, 16, 32, 64)]
    levels = Levels.of(masks)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, levels.num_tokens, args.d_model, generator=g)
    pos = torch.randn(2, levels.num_tokens, args.d_model, generator=g)
    t = torch.randn(2, args.queries, args.d_model, generator=g)
    qpos = torch.randn(2, args.queries, args.d_model, generator=g)
    boxes = torch.rand(2, args.queries, 4, generator=g) * 0.5 + 0.25  # (cx, cy, w, h) in the valid area
    return levels, masks, x, pos, t, qpos, boxes


class HFDecoder(nn.Module):
    def __init__(self, cfg, n):
        super().__init__()
        self.layers = nn.ModuleList(DeformableDetrDecoderLayer(cfg) for _ in range(n))

    def forward(self, t, qpos, ref_xy, memory, levels, valid):
        for layer in self.layers:
            t = layer(t, qpos, ref_xy, levels.tensor(), list(levels.shapes), torch.tensor(levels.start), memory, valid)
        return t


def make(args):
    torch.manual_seed(0)
    cfg = DeformableDetrConfig(d_model=args.d_model, encoder_layers=args.layers, encoder_attention_heads=8,
                               decoder_attention_heads=8, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                               num_feature_levels=4, encoder_n_points=4, decoder_n_points=4, dropout=0.0,
                               use_timm_backbone=False, backbone_config={"model_type": "resnet"})
    hf_enc, hf_dec = DeformableDetrEncoder(cfg).train(), HFDecoder(cfg, args.layers).train()
    with torch.no_grad():  # random, O(1) weights (the init's zero offset weights would sample one point)
        for p in list(hf_enc.parameters()) + list(hf_dec.parameters()):
            p.normal_(0, 1.0 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.1)
    enc_state, _ = deformable_keys({"model.encoder." + k: v for k, v in hf_enc.state_dict().items()}, "transformers",
                                   encoder="")
    dec_state, _ = deformable_keys({"model.decoder." + k: v for k, v in hf_dec.state_dict().items()}, "transformers",
                                   decoder="")
    enc = DeformableEncoder(args.d_model, 8, args.layers, 1024, dropout=0.0).train()
    enc.layers.load_state_dict(enc_state)
    dec = nn.ModuleList(DeformableDecoderLayer(args.d_model, 8, 1024, dropout=0.0) for _ in range(args.layers)).train()
    dec.load_state_dict(dec_state)
    return hf_enc, hf_dec, enc, dec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    C.positive_args(ap, args, "rounds", "iters", "d_model", "layers", "queries")
    levels, masks, x, pos, t, qpos, boxes = inputs(args)
    ratios, pad = valid_ratios(masks), levels.flatten(masks)
    ref_xy = boxes[:, :, None] * torch.cat([ratios.flip(-1)] * 2, -1)[:, None]  # transformers' (x, y, w, h) input
    ref_yx = points_at_levels(swap_xy(boxes), ratios)
    hf_enc, hf_dec, enc, dec = make(args)

    def hf_encode():
        return hf_enc(inputs_embeds=x, attention_mask=~pad, spatial_position_embeddings=pos,
                      spatial_shapes=levels.tensor(), spatial_shapes_list=list(levels.shapes),
                      level_start_index=torch.tensor(levels.start), valid_ratios=ratios.flip(-1)).last_hidden_state

    def vispe_decode():
        out = t
        for layer in dec:
            out = layer(out, qpos, ref_yx, x, levels, pad)
        return out

    steps = {"encoder transformers": hf_encode, "encoder vispe": lambda: enc(x, levels, pos, ratios, pad),
             "decoder transformers": lambda: hf_dec(t, qpos, ref_xy, x, levels, ~pad), "decoder vispe": vispe_decode}
    with torch.no_grad():
        for part in ("encoder", "decoder"):
            diff = (steps[f"{part} vispe"]() - steps[f"{part} transformers"]())[~pad if part == "encoder" else ...]
            print(f"{part}: max |output difference| before timing {diff.abs().max():.2e}")

    def stepper(fn):
        return lambda: fn().sum().backward()

    times = C.interleaved({n: stepper(f) for n, f in steps.items()}, args.rounds, args.iters)
    print(f"# forward+backward, d_model {args.d_model}, 8 heads, 4 levels x 4 points, {args.layers} layers, "
          f"{levels.num_tokens} tokens, {args.queries} queries, batch 2; {args.rounds} interleaved rounds; {C.machine()}")
    for part in ("encoder", "decoder"):
        h, v = f"{part} transformers", f"{part} vispe"
        for clock in ("wall", "cpu"):
            lo, hi = C.spread(times, v, h, clock)
            print(f"{part} {clock:4s}: transformers {C.ms(times, h, clock):7.1f} ms, vispe {C.ms(times, v, clock):7.1f} ms, "
                  f"ratio vispe/transformers {C.ratio(times, v, h, clock):.3f} (quartiles {lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
