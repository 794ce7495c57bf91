"""Converted towers over the originals on packed batches of mixed sizes (issue 55): forward and
forward+backward time of ``convert_vit(original)`` (the packed path where frames differ in size, the
canvas where they are equal: ``tower.path="auto"``) over transformers' original, random weights,
width 256, 4 blocks, interleaved rounds in one process, ratios (medians over rounds of per-round
ratios, wall clock) printed side by side with each row's output error.

    flock /tmp/vispe-heavy.lock .venv/bin/python bench/towers_packed.py --threads 2 --rounds 5
"""
from __future__ import annotations

import argparse
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
from _common import interleaved, machine, ms, positive_args, ratio, spread  # noqa: E402

from vispe.models.vit import convert_vit  # noqa: E402

WIDTH, DEPTH, HEADS = 256, 4, 4


def qwen2(windowed: bool):
    if windowed:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig as Cfg
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as M
        cfg = Cfg(depth=DEPTH, hidden_size=WIDTH, out_hidden_size=WIDTH, num_heads=HEADS, intermediate_size=4 * WIDTH,
                  fullatt_block_indexes=[DEPTH - 1])  # windows of 112 px = 4 x 4 merged tokens
    else:
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig as Cfg
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as M
        cfg = Cfg(depth=DEPTH, embed_dim=WIDTH, hidden_size=WIDTH, num_heads=HEADS, mlp_ratio=4)
    return M(cfg).eval()


def qwen_inputs(model, grids):
    cfg, thw = model.config, torch.tensor([[1, h, w] for h, w in grids])
    x = torch.randn(int(thw.prod(-1).sum()), cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2)
    return (x, thw)


def pixtral():
    from transformers import PixtralVisionConfig, PixtralVisionModel

    return PixtralVisionModel(PixtralVisionConfig(hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_hidden_layers=DEPTH,
                                                  num_attention_heads=HEADS, image_size=1024, patch_size=16)).eval()


def pixtral_inputs(model, sizes):
    H, W = max(h for h, _ in sizes), max(w for _, w in sizes)
    return (torch.randn(len(sizes), 3, H, W), torch.tensor(sizes))


def batches(seed: int = 0):
    rng = random.Random(seed)
    rand_q = [(2 * rng.randint(2, 24), 2 * rng.randint(2, 24)) for _ in range(16)]  # patches, even
    rand_p = [(16 * rng.randint(4, 40), 16 * rng.randint(4, 40)) for _ in range(16)]  # px
    q = {"32x32 + 8x64 + 16x16": [(32, 32), (8, 64), (16, 16)],
         "48x8 + 8x48 + 4x4 + 4x4": [(48, 8), (8, 48), (4, 4), (4, 4)],
         "two 32x32": [(32, 32), (32, 32)], "16 random (4..48 patches a side)": rand_q}
    return [("Qwen2-VL", lambda: qwen2(False), qwen_inputs, q), ("Qwen2.5-VL", lambda: qwen2(True), qwen_inputs, q),
            ("Pixtral", pixtral, pixtral_inputs,
             {"512x512 + 128x512 + 256x256 px": [(512, 512), (128, 512), (256, 256)],
              "768x128 + 128x768 px": [(768, 128), (128, 768)], "16 random (64..640 px a side)": rand_p})]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="towers to run (Qwen2-VL, Qwen2.5-VL, Pixtral)")
    args = ap.parse_args(argv)
    positive_args(ap, args, "threads", "rounds")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"machine: {machine()}; width {WIDTH}, {DEPTH} blocks, {args.rounds} interleaved rounds")
    print("| tower | batch | path | fwd ms (orig) | fwd ratio [IQR] | fwd+bwd ms (orig) | fwd+bwd ratio [IQR] | max err |")
    print("|---|---|---|---|---|---|---|---|")
    for tower, build, inputs, cases in batches():
        if args.only and tower not in args.only:
            continue
        orig = build()
        conv = convert_vit(orig)
        for label, sizes in cases.items():
            a = inputs(orig, sizes)
            with torch.no_grad():
                err = (conv(*a).last_hidden_state - orig(*a).last_hidden_state).abs().max().item()

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
            t = interleaved({"of": fwd(orig), "cf": fwd(conv), "ob": step(orig), "cb": step(conv)}, args.rounds)
            f, b = spread(t, "cf", "of"), spread(t, "cb", "ob")
            print(f"| {tower} | {label} | {conv.last_path} | {ms(t, 'of'):.0f} | {ratio(t, 'cf', 'of'):.2f}x "
                  f"[{f[0]:.2f}, {f[1]:.2f}] | {ms(t, 'ob'):.0f} | {ratio(t, 'cb', 'ob'):.2f}x [{b[0]:.2f}, {b[1]:.2f}] "
                  f"| {err:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
