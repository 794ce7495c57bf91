"""Cost of the block-rotation and direction encodings (issue 38), two parts, each one interleaved run.

    python bench/rope_blocks.py [--rounds 5] [--part step|exp|both|issue52]

``step``: training-step time (forward + backward + AdamW) of a ViT with ``liere``, ``comrope``,
``string``, ``lookhere`` (defaults), ``none`` and ``rope_mixed``, at 64 tokens (32 x 32 px) and at
1,024 tokens (128 x 128 px), patch 4, dim 192, 3 heads of 64 channels, depth 2; printed as the
median over rounds of each step time divided by that round's ``none`` and ``rope_mixed`` times.

``exp``: what the exponential costs per layer and step (forward + backward of the rotations of a
16 x 16 grid, 3 heads of 64 channels, a padded batch of 4 images of 16 x 16, 16 x 14, 14 x 16 and
14 x 14 valid tokens), the reference's way (``torch.linalg.matrix_exp`` of every token's generator,
per image) against vispe's (``vispe.lie.expm`` once per distinct coordinate for LieRE, per distinct
y and x for ComRoPE, no exponential for STRING), and vispe's in eval mode (rotations cached).

``issue52``: issue 52's targets, at 1,024 and 4,096 tokens (batch 1): the training step of every
registered variant of ``string``, ``comrope`` and ``liere`` over ``none``'s and ``rope_mixed``'s, and
the bytes autograd keeps for backward over ``none``'s, each beside the same model through today's
block rotations (``[blocks]``: ``rope_blocks.rotate_qk(method="blocks")``), in one interleaved run.

Both in wall and CPU time (``bench/_common.py``); CPU time is the steadier on a shared machine.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
from _common import interleaved, machine, ratio, train_step  # noqa: E402

from vispe.models.vit import create_vit  # noqa: E402
from vispe.registry import build_in  # noqa: E402

STEP = ["none", "rope_mixed", "liere", "comrope", "string", "lookhere"]


def part_step(rounds: int, iters: int) -> None:
    for px, batch in ((32, 32), (128, 2)):
        torch.manual_seed(0)
        x, y = torch.randn(batch, 3, px, px), torch.randint(0, 10, (batch,))
        fns = {}
        for pe in STEP:
            m = create_vit("vit_pico", pe=pe, embed_dim=192, num_heads=3, depth=2, img_size=px, patch_size=4,
                           num_classes=10)
            fns[pe] = train_step(m, x, y)
        times = interleaved(fns, rounds, iters)
        n = (px // 4) ** 2
        print(f"\n## training step, {n} tokens (+1 class), batch {batch}, dim 192, 3 heads x 64, depth 2")
        print(f"{'encoding':12s} {'ms/step':>9s} {'cpu ms':>8s} {'/ none':>7s} {'/ rope_mixed':>13s}   (wall; cpu in brackets)")
        for pe in STEP:
            w = sorted(t[0] for t in times[pe])[len(times[pe]) // 2] * 1e3
            c = sorted(t[1] for t in times[pe])[len(times[pe]) // 2] * 1e3
            print(f"{pe:12s} {w:9.1f} {c:8.1f} {ratio(times, pe, 'none'):7.2f} "
                  f"{ratio(times, pe, 'rope_mixed'):13.2f}   ({ratio(times, pe, 'none', 'cpu'):.2f}, "
                  f"{ratio(times, pe, 'rope_mixed', 'cpu'):.2f})")


def part_exp(rounds: int, iters: int) -> None:
    torch.manual_seed(0)
    H, d, (h, w) = 3, 64, (16, 16)
    ctx = dict(dim=H * d, num_heads=H, head_dim=d, grid=(h, w))
    mask = torch.ones(4, h, w, dtype=torch.bool)
    for b, (vh, vw) in enumerate([(16, 16), (16, 14), (14, 16), (14, 14)]):
        mask[b, :vh, :vw] = False
    encs = {"liere": build_in("liere", ctx), "comrope": build_in("comrope", ctx), "string": build_in("string", ctx)}

    def coords_of(pe):  # the coordinates each encoding's angles() receives, per image  # (B, N, 2)
        from vispe.coords import valid_coords, valid_extent

        c = valid_coords((h, w), mask, pe.coords)
        return pe.convention(c, valid_extent(mask, (h, w), None)[:, None]) if pe.has_convention else c

    def reference(pe):  # every token of every image: one matrix_exp of its dense generator
        c = coords_of(pe)  # (B, N, 2)
        if pe.registry_name == "liere":
            A = pe.generator_matrices()  # (H, 2, nb, b, b)
        elif pe.registry_name == "comrope":
            A = pe.axis_generators()
        else:  # STRING: L_k = P^T Lambda_k P, dense, as the paper's exp(sum_k p_k L_k)
            P = pe.basis()
            f = pe.frequencies()  # (H, d/2, 2)
            lam = torch.zeros(H, 2, d, d)
            i = torch.arange(d // 2)
            lam[:, :, 2 * i + 1, 2 * i] = f.transpose(1, 2)
            lam[:, :, 2 * i, 2 * i + 1] = -f.transpose(1, 2)
            A = (P.transpose(-1, -2)[:, None] @ lam @ P[:, None])[:, :, None]  # (H, 2, 1, d, d)
        G = torch.einsum("bnk,hkjxy->bnhjxy", c, A)  # (B, N, H, nb, b, b)
        return torch.linalg.matrix_exp(G)

    def fwd_bwd(fn, pe):
        def run():
            pe.zero_grad(set_to_none=True)
            fn(pe).sum().backward()
        return run

    def vispe(pe):
        return pe((h, w), mask)

    fns = {}
    for name, pe in encs.items():
        pe.train(False)
        fns[f"{name}: matrix_exp per token (reference)"] = fwd_bwd(reference, pe)
        fns[f"{name}: vispe"] = fwd_bwd(vispe, pe)

        def cached(pe=pe):
            from vispe.kernels.rope_blocks import rotations_for

            with torch.no_grad():
                rotations_for(pe, (h, w), None, 1, torch.device("cpu"))
        fns[f"{name}: vispe, eval, cached (no mask)"] = cached
    times = interleaved(fns, rounds, iters)
    print("\n## rotations of one layer, forward + backward: 3 heads x 64 channels, 16 x 16 grid, padded batch of 4")
    print(f"{'':55s} {'ms':>8s} {'cpu ms':>8s} {'ref / this':>11s}   (cpu)")
    for name in encs:
        ref = f"{name}: matrix_exp per token (reference)"
        for key in [k for k in fns if k.startswith(name + ":")]:
            t = times[key]
            wall = sorted(x[0] for x in t)[len(t) // 2] * 1e3
            cpu = sorted(x[1] for x in t)[len(t) // 2] * 1e3
            print(f"{key:55s} {wall:8.1f} {cpu:8.1f} {ratio(times, ref, key):11.1f}   ({ratio(times, ref, key, 'cpu'):.1f})")


ISSUE52 = ["none", "rope_mixed", "string", "string:circulant", "comrope", "comrope:ap", "liere"]


def _vit(pe: str, px: int):
    name, _, variant = pe.partition(":")
    kw = {"pe_kwargs": {"variant": variant}} if variant else {}
    return create_vit("vit_pico", pe=name, embed_dim=192, num_heads=3, depth=2, img_size=px, patch_size=4,
                      num_classes=10, **kw)


def _blocks(step):
    """``step`` with today's block rotations (``rope_blocks.rotate_qk(method="blocks")``)."""
    from vispe.kernels import rope_blocks

    plain = rope_blocks.rotate_qk

    def run():
        rope_blocks.rotate_qk = lambda *a, **k: plain(*a, **k, method="blocks")
        try:
            step()
        finally:
            rope_blocks.rotate_qk = plain
    return run


def saved_bytes(step_model, x, y) -> int:
    """Bytes of the distinct storages autograd keeps for backward in one training forward."""
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.cross_entropy(step_model(x), y)
    loss.backward()
    return sum(seen.values())


def part_issue52(rounds: int, iters: int) -> None:
    """Issue 52's targets: training step over rope_mixed's and none's, tensors saved for backward over
    none's, at 1,024 and 4,096 tokens, batch 1; "[blocks]" rows: today's block rotations."""
    from vispe.kernels import rope_blocks

    has_blocks = hasattr(rope_blocks, "METHODS")
    for px in (128, 256):
        torch.manual_seed(0)
        x, y = torch.randn(1, 3, px, px), torch.randint(0, 10, (1,))
        fns, saved = {}, {}
        for pe in ISSUE52:
            m = _vit(pe, px)
            saved[pe] = saved_bytes(m, x, y)
            fns[pe] = train_step(m, x, y)
            if has_blocks and pe not in ("none", "rope_mixed"):
                fns[pe + " [blocks]"] = _blocks(train_step(m, x, y))
                saved[pe + " [blocks]"] = 0
                _blocks(lambda m=m, k=pe + " [blocks]": saved.__setitem__(k, saved_bytes(m, x, y)))()
        times = interleaved(fns, rounds, iters)
        n = (px // 4) ** 2
        print(f"\n## issue 52: training step and saved tensors, {n} tokens (+1 class), batch 1, dim 192, 3 x 64, depth 2")
        print(f"{'encoding':24s} {'ms/step':>9s} {'/ none':>7s} {'/ rope_mixed':>13s} {'saved MiB':>10s} {'/ none':>7s}"
              "   (cpu ratios)")
        for pe in fns:
            w = sorted(t[0] for t in times[pe])[len(times[pe]) // 2] * 1e3
            print(f"{pe:24s} {w:9.1f} {ratio(times, pe, 'none'):7.2f} {ratio(times, pe, 'rope_mixed'):13.2f} "
                  f"{saved[pe] / 2**20:10.1f} {saved[pe] / saved['none']:7.2f}   "
                  f"({ratio(times, pe, 'none', 'cpu'):.2f}, {ratio(times, pe, 'rope_mixed', 'cpu'):.2f})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--part", default="both", choices=["step", "exp", "both", "issue52"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# bench/rope_blocks.py --rounds {args.rounds} --part {args.part}; {machine()}")
    if args.part in ("exp", "both"):
        part_exp(args.rounds, args.iters)
    if args.part in ("step", "both"):
        part_step(args.rounds, args.iters)
    if args.part == "issue52":
        part_issue52(args.rounds, args.iters)
    print(f"\n(load average at the end: {machine().rsplit('load average ', 1)[-1]})")


if __name__ == "__main__":
    main()
