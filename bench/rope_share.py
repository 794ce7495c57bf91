"""RoPE cost as a share of one SDPA call, vispe vs timm, forward + backward.

    python bench/rope_share.py [--rounds 7] [--grid 32 32] [--batch 8] [--heads 6] [--head-dim 64]

q, k, v of shape (batch, heads, h*w, head_dim) (default (8, 6, 1024, 64)) are slices of one leaf
tensor, as they come out of the qkv projection. For each row, one timed call builds what the row
needs per layer and step (tables or angles), rotates q and k, and runs the backward pass from a
fixed output gradient; the share is that time divided by one SDPA forward + backward on the same
q, k, v, taken in the same round (rounds interleave every row), median over rounds, in wall time
and in the process's CPU time (the steadier one on a shared machine, ``bench/_common.py``).

Rows: timm axial (``RotaryEmbeddingCat``, cached sin/cos, ``apply_rot_embed_cat`` on q then k, as
timm's Eva), timm mixed (``RotaryEmbeddingMixed`` of one block, embedding rebuilt each step),
vispe's reference path (``apply_rope`` on fresh angles, q and k apart) and its default fused path
(``vispe.kernels.rope.rotate_qk``: tables cached for axial, learned angles once per layer for
mixed, q and k in one call), and ``--compiled`` adds the torch.compile kernel.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import interleaved, machine, ms, ratio  # noqa: E402

from vispe.image.rope_axial import RopeAxial  # noqa: E402
from vispe.image.rope_mixed import RopeMixed  # noqa: E402
from vispe.kernels.rope import rotate_qk  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--grid", type=int, nargs=2, default=[32, 32])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--compiled", action="store_true", help="also time the torch.compile kernel")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="of q, k, v")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingMixed, apply_rot_embed_cat

    torch.manual_seed(0)
    (h, w), B, H, d = args.grid, args.batch, args.heads, args.head_dim
    N = h * w
    dev, dt = torch.device(args.device), getattr(torch, args.dtype)
    qkv = torch.randn(3, B, H, N, d, device=dev, dtype=dt, requires_grad=True)  # the projection's output, one leaf
    g = torch.randn(2, B, H, N, d, device=dev, dtype=dt)  # gradient reaching the rotated q and k

    def sdpa():
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        out.backward(g[0])

    timm_axial = RotaryEmbeddingCat(d, in_pixels=False, feat_shape=[h, w], temperature=100.0).to(dev)
    timm_mixed = RotaryEmbeddingMixed(H * d, depth=1, num_heads=H, feat_shape=[h, w]).to(dev)

    def t_axial():
        emb = timm_axial.get_embed()  # (N, 2d), cached
        q = apply_rot_embed_cat(qkv[0], emb)
        k = apply_rot_embed_cat(qkv[1], emb)
        torch.autograd.backward([q, k], [g[0], g[1]])

    def t_mixed():
        emb = timm_mixed.get_embed()[0]  # (H, N, 2d), rebuilt from the learned freqs
        q = apply_rot_embed_cat(qkv[0], emb)
        k = apply_rot_embed_cat(qkv[1], emb)
        torch.autograd.backward([q, k], [g[0], g[1]])

    axial, mixed = RopeAxial(d, H).to(dev), RopeMixed(d, H).to(dev)

    def ours(pe, impl):
        def run():
            rotate_qk(pe, qkv[:2], (h, w), impl=impl).backward(g)
        return run

    rows = {"sdpa": sdpa, "timm axial": t_axial, "vispe axial reference": ours(axial, "reference"),
            "vispe axial": ours(axial, "fused"), "timm mixed": t_mixed,
            "vispe mixed reference": ours(mixed, "reference"), "vispe mixed": ours(mixed, "fused")}
    if args.compiled:
        rows["vispe axial compiled"] = ours(axial, "compiled")
        rows["vispe mixed compiled"] = ours(mixed, "compiled")
    times = interleaved(rows, args.rounds, args.iters, sync=torch.cuda.synchronize if dev.type == "cuda" else None)
    print("# RoPE (angles + rotation of q and k, forward + backward) as a share of one SDPA forward + backward")
    print(f"# q, k, v ({B}, {H}, {N}, {d}), grid {h}x{w}, {args.dtype} on {dev.type}; {args.rounds} interleaved "
          f"rounds x {args.iters} calls")
    print(f"# {machine()}")
    print("| row | ms (wall) | share of SDPA (wall time) | share of SDPA (CPU time) |")
    print("|---|---|---|---|")
    for n in rows:
        print(f"| {n} | {ms(times, n):.1f} | {ratio(times, n, 'sdpa'):.3f} | {ratio(times, n, 'sdpa', 'cpu'):.3f} |")


if __name__ == "__main__":
    main()
