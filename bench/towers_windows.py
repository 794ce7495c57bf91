"""Qwen2.5-VL's windows on the packed path, index sets against a mask, side by side (issue 55): the
converted tower with its windows as ``TokenGroups`` (gathered, SDPA without a mask) and the same tower
with each frame's windows as an SDPA mask (``window_mask``, the previous stop's path), interleaved
rounds in one process, forward and forward+backward, wall-clock and CPU-time ratios (gathered / mask).

    /work/bin/lane --both .venv/bin/python bench/towers_windows.py --threads 1 --rounds 5
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import torch  # noqa: E402
import towers_packed as T  # noqa: E402
from _common import interleaved, machine, ms, positive_args, ratio  # noqa: E402

from vispe.models.towers.qwen_vl import window_mask  # noqa: E402
from vispe.models.vit import convert_vit  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    positive_args(ap, args, "threads", "rounds")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    orig = T.qwen2(True)
    gathered, masked = convert_vit(orig), convert_vit(orig)
    patches = masked.window_blocks * masked.spatial_merge_size
    masked._windows = lambda shape, mask, device: {  # the mask inside each frame, as before index sets
        i: window_mask(shape, patches, mask, device) for i in range(len(masked.blocks)) if i not in masked.fullatt_block_indexes}
    print(f"machine: {machine()}; width {T.WIDTH}, {T.DEPTH} blocks, {args.rounds} interleaved rounds")
    print("| batch | fwd ms (mask) | fwd gathered/mask wall | CPU time | fwd+bwd ms (mask) | fwd+bwd gathered/mask wall "
          "| CPU time |\n|---|---|---|---|---|---|---|")
    for label, sizes in [("32x32 + 8x64 + 16x16", [(32, 32), (8, 64), (16, 16)]),
                         ("48x8 + 8x48 + 4x4 + 4x4", [(48, 8), (8, 48), (4, 4), (4, 4)])]:
        a = T.qwen_inputs(orig, sizes)
        with torch.no_grad():
            torch.testing.assert_close(gathered(*a).last_hidden_state, masked(*a).last_hidden_state, rtol=0, atol=1e-5)

        def fwd(m):
            def run():
                with torch.no_grad():
                    m(*a)
            return run

        def step(m):
            def run():
                m.zero_grad(set_to_none=True)
                m(*a).last_hidden_state.square().mean().backward()
            return run
        t = interleaved({"gf": fwd(gathered), "mf": fwd(masked), "gb": step(gathered), "mb": step(masked)}, args.rounds)
        print(f"| {label} | {ms(t, 'mf'):.0f} | {ratio(t, 'gf', 'mf'):.2f}x | {ratio(t, 'gf', 'mf', 'cpu'):.2f}x "
              f"| {ms(t, 'mb'):.0f} | {ratio(t, 'gb', 'mb'):.2f}x | {ratio(t, 'gb', 'mb', 'cpu'):.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
