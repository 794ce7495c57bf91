"""Learned relative bias: time and peak memory against attention without bias, as the grid grows.

    python bench/bias_attention.py [--grids 8 16 32 64] [--rounds 5] [--batch 8] [--heads 6] [--head-dim 64]

For each grid (h x h tokens), q, k, v (batch, heads, h*h, head_dim) are leaves; one timed call is
forward + backward of one attention layer:

* ``no bias``: ``scaled_dot_product_attention(q, k, v)`` (the fused kernel);
* ``vispe relative``: Swin's learned table (``relbias``) kept as a table
  (``vispe.kernels.relative_bias``, forced with impl="chunked"; vispe's attention takes it by
  default once the dense bias would exceed 2 MiB; the dense bias is never built);
* ``vispe relative (bmm)``: the same kernel with its backward's products through torch's ``bmm``
  (MKL) instead of oneDNN's linear (``_relative_blocks.onednn_linear`` patched to False): what
  oneDNN buys;
* ``vispe auto``: the same table gathered to a dense (1, heads, N, N) bias and
  ``vispe.kernels.bias_attention.attend`` on its default path (on the CPU: "chunked");
* ``vispe reference``: the same bias as SDPA's float mask (with a gradient: the math kernel);
* ``timm RelPosBias``: timm's table (``timm.layers.pos_embed_rel.RelPosBias``) + SDPA, as
  ``VisionTransformerRelPos``.

Rows of one grid interleave round by round; ratios are medians over rounds of a row's time over
``no bias``'s time in the same round, in wall time and in the process's CPU time (the steadier one
on a shared machine, ``bench/_common.py``). Peak memory is the highest total of the bytes allocated and
not yet freed during one call (torch's profiler, ``profile_memory=True``; inputs not counted,
gradients and everything the call creates counted), over the same for ``no bias``. Rows whose
math kernel would need more than ``--max-gb`` are skipped.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import cpu_alloc_peak, interleaved, machine, ms, ratio  # noqa: E402

from vispe.image.relbias import RelBias  # noqa: E402
from vispe.kernels import _relative_blocks  # noqa: E402
from vispe.kernels.bias_attention import attend, pick_impl  # noqa: E402
from vispe.kernels.relative_bias import RelativeBias, attend_relative  # noqa: E402


def peak_bytes(fn, device: torch.device) -> int:
    """Highest sum of allocations minus frees during ``fn()``: profiler memory events in order on the
    CPU, the caching allocator's peak on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    return cpu_alloc_peak(fn)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grids", type=int, nargs="*", default=[8, 16, 32, 64])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-gb", type=float, default=4.0, help="skip math-kernel rows needing more than this")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="of q, k, v and the bias")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from timm.layers.pos_embed_rel import RelPosBias

    B, H, d = args.batch, args.heads, args.head_dim
    dev, dt = torch.device(args.device), getattr(torch, args.dtype)
    print(f"# attention forward + backward with a learned relative bias vs without, batch {B}, {H} heads, "
          f"head_dim {d}, {args.dtype} on {dev.type}; {args.rounds} interleaved rounds per grid")
    print(f"# {machine()}")
    print("| grid | tokens | row | path | ms (wall) | time / no bias (wall) | (CPU time) | peak MiB | memory / no bias |")
    print("|---|---|---|---|---|---|---|---|---|")
    for g in args.grids:
        torch.manual_seed(0)
        N = g * g
        q, k, v = (torch.randn(B, H, N, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
        ours = RelBias(H, grid=(g, g)).to(dev)
        theirs = RelPosBias((g, g), H).to(dev)
        params = [q, k, v, ours.table, theirs.relative_position_bias_table]

        def clear():
            for p in params:
                p.grad = None

        def no_bias():
            F.scaled_dot_product_attention(q, k, v).sum().backward()

        def vispe(impl):
            return lambda: attend(q, k, v, bias=ours((g, g), dtype=dt), impl=impl).sum().backward()

        def relative():
            table = ours.relative_table((g, g), dev).to(dt)
            return attend_relative(q, k, v, RelativeBias(table, (g, g), None, dense=None), impl="chunked").sum().backward()

        def relative_bmm():
            saved, _relative_blocks.onednn_linear = _relative_blocks.onednn_linear, lambda: False
            try:
                relative()
            finally:
                _relative_blocks.onednn_linear = saved

        def timm_row():
            F.scaled_dot_product_attention(q, k, v, attn_mask=theirs.get_bias().to(dt)).sum().backward()

        rows = {"no bias": no_bias, "vispe relative": relative, "vispe relative (bmm)": relative_bmm,
                "vispe auto": vispe("auto")}
        math_bytes = 4 * B * H * N * N * 4  # scores, probabilities and their gradients
        skipped = []
        if math_bytes <= args.max_gb * 2**30:
            rows.update({"vispe reference": vispe("reference"), "timm RelPosBias": timm_row})
        else:
            skipped = ["vispe reference", "timm RelPosBias"]
        fns = {n: (lambda f=f: (clear(), f())) for n, f in rows.items()}
        sync = torch.cuda.synchronize if dev.type == "cuda" else None
        times = interleaved(fns, args.rounds if N <= 1024 else max(2, args.rounds // 2), sync=sync)
        mem = {}
        for n, f in rows.items():
            clear()
            mem[n] = peak_bytes(f, dev)
        with torch.enable_grad():
            auto_path = pick_impl("auto", q, ours((g, g)))
        for n in rows:
            path = {"no bias": "sdpa", "vispe relative": "relative", "vispe relative (bmm)": "relative",
                    "vispe auto": auto_path, "vispe reference": "reference",
                    "timm RelPosBias": "reference"}[n]
            print(f"| {g}x{g} | {N} | {n} | {path} | {ms(times, n):.1f} | {ratio(times, n, 'no bias'):.2f} | "
                  f"{ratio(times, n, 'no bias', 'cpu'):.2f} | {mem[n] / 2**20:.1f} | {mem[n] / mem['no bias']:.2f} |")
        for n in skipped:
            print(f"| {g}x{g} | {N} | {n} | reference | skipped: the math kernel would need about "
                  f"{math_bytes / 2**30:.1f} GiB (--max-gb {args.max_gb:g}) | | | | |")
        q = k = v = ours = theirs = params = None  # free this grid's tensors before the next (not del: the closures above name them)


if __name__ == "__main__":
    main()
