"""Converted towers over the originals on packed batches of mixed sizes (issue 55): forward and
forward+backward time of ``convert_vit(original)`` (``tower.path="auto"``: the packed path where frames
differ in size, the canvas where they are equal; SigLIP2 and Idefics3 also with ``path="packed"``, which
their "auto" leaves to the canvas for the native table) over transformers' original, random weights,
interleaved rounds in one process, ratios (medians over rounds of per-round ratios, wall clock)
printed side by side with each row's output error (valid tokens). The CPU-time ratios (this process's
CPU seconds, ``bench/_common.timed``) do not count the time other jobs held the cores: on a shared
machine they are the steadier reading.

    /work/bin/lane --both .venv/bin/python bench/towers_packed.py --threads 2 --rounds 5
    /work/bin/lane --both .venv/bin/python bench/towers_packed.py --released --depth 1 --rounds 3 --only Qwen2.5-VL

``--released``: each tower at its smallest released size's width, heads and MLP (Qwen2-VL-2B's and
Qwen2.5-VL-3B's towers 1280 wide, Pixtral-12B's 1024, SigLIP2 base and SmolVLM's Idefics3 tower 768)
with ``--depth`` blocks (default 4 at width 256). Llama 4 is not here: its tiles are one size (the
canvas path; tests/test_towers_packed.py).
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
#: the smallest released size of each tower: (width, heads, MLP width)
RELEASED = {"Qwen2-VL": (1280, 16, 5120), "Qwen2.5-VL": (1280, 16, 3420), "Pixtral": (1024, 16, 4096),
            "SigLIP2": (768, 12, 3072), "Idefics3": (768, 12, 3072)}


def size(tower: str, released: bool) -> tuple[int, int, int]:
    return RELEASED[tower] if released else (WIDTH, HEADS, 4 * WIDTH)


def qwen2(windowed: bool, released: bool = False, depth: int = DEPTH):
    if windowed:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig as Cfg
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as M
        width, heads, mlp = size("Qwen2.5-VL", released)
        cfg = Cfg(depth=depth, hidden_size=width, out_hidden_size=width, num_heads=heads, intermediate_size=mlp,
                  fullatt_block_indexes=[depth - 1] if depth > 1 else [])  # windows of 112 px = 4 x 4 merged tokens
    else:
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig as Cfg
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as M
        width, heads, mlp = size("Qwen2-VL", released)
        cfg = Cfg(depth=depth, embed_dim=width, hidden_size=width, num_heads=heads, mlp_ratio=mlp // width)
    return M(cfg).eval()


def qwen_inputs(model, grids):
    cfg, thw = model.config, torch.tensor([[1, h, w] for h, w in grids])
    x = torch.randn(int(thw.prod(-1).sum()), cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2)
    return (x, thw)


def pixtral(released: bool = False, depth: int = DEPTH):
    from transformers import PixtralVisionConfig, PixtralVisionModel

    width, heads, mlp = size("Pixtral", released)
    return PixtralVisionModel(PixtralVisionConfig(hidden_size=width, intermediate_size=mlp, num_hidden_layers=depth,
                                                  num_attention_heads=heads, image_size=1024, patch_size=16)).eval()


def siglip2(released: bool = False, depth: int = DEPTH):
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    width, heads, mlp = size("SigLIP2", released)
    return Siglip2VisionModel(Siglip2VisionConfig(hidden_size=width, intermediate_size=mlp, num_hidden_layers=depth,
                                                  num_attention_heads=heads, num_patches=256, patch_size=16)).eval()


def siglip2_inputs(model, grids):
    """SigLIP2's packed rows: each image's h*w patches first, padding to the longest image's count."""
    L, d = max(h * w for h, w in grids), model.config.num_channels * model.config.patch_size ** 2
    mask = torch.zeros(len(grids), L, dtype=torch.long)
    for b, (h, w) in enumerate(grids):
        mask[b, :h * w] = 1
    return (torch.randn(len(grids), L, d) * mask[..., None], mask, torch.tensor(grids))


def idefics3(released: bool = False, depth: int = DEPTH):
    from transformers import Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer

    width, heads, mlp = size("Idefics3", released)
    return Idefics3VisionTransformer(Idefics3VisionConfig(hidden_size=width, intermediate_size=mlp, num_hidden_layers=depth,
                                                          num_attention_heads=heads, image_size=512, patch_size=16)).eval()


def idefics3_inputs(model, grids):
    """Images padded bottom/right into one batch, ``patch_attention_mask`` on each image's patches."""
    p, H, W = model.config.patch_size, max(h for h, _ in grids), max(w for _, w in grids)
    pm = torch.zeros(len(grids), H, W, dtype=torch.bool)
    for b, (h, w) in enumerate(grids):
        pm[b, :h, :w] = True
    return (torch.randn(len(grids), 3, H * p, W * p) * pm.repeat_interleave(p, 1).repeat_interleave(p, 2)[:, None], pm)


def valid_rows(tower: str, a):
    """Which rows of last_hidden_state are image tokens (padded slots differ on the packed path by design)."""
    if tower == "SigLIP2":
        return a[1].bool()
    if tower == "Idefics3":
        return a[1].flatten(1)
    return None


def pixtral_inputs(model, sizes):
    H, W = max(h for h, _ in sizes), max(w for _, w in sizes)
    return (torch.randn(len(sizes), 3, H, W), torch.tensor(sizes))


def batches(released: bool, depth: int, seed: int = 0):
    rng = random.Random(seed)
    rand_q = [(2 * rng.randint(2, 24), 2 * rng.randint(2, 24)) for _ in range(16)]  # patches, even
    rand_p = [(16 * rng.randint(4, 40), 16 * rng.randint(4, 40)) for _ in range(16)]  # px
    q = {"32x32 + 8x64 + 16x16": [(32, 32), (8, 64), (16, 16)],
         "48x8 + 8x48 + 4x4 + 4x4": [(48, 8), (8, 48), (4, 4), (4, 4)],
         "two 32x32": [(32, 32), (32, 32)], "16 random (4..48 patches a side)": rand_q}
    grids = {k: v for k, v in q.items() if k != "two 32x32"}  # the native table's rows are padded either way
    return [("Qwen2-VL", lambda: qwen2(False, released, depth), qwen_inputs, q, ("auto",)),
            ("Qwen2.5-VL", lambda: qwen2(True, released, depth), qwen_inputs, q, ("auto",)),
            ("Pixtral", lambda: pixtral(released, depth), pixtral_inputs,
             {"512x512 + 128x512 + 256x256 px": [(512, 512), (128, 512), (256, 256)],
              "768x128 + 128x768 px": [(768, 128), (128, 768)], "16 random (64..640 px a side)": rand_p}, ("auto",)),
            ("SigLIP2", lambda: siglip2(released, depth), siglip2_inputs, grids, ("auto", "packed")),
            ("Idefics3", lambda: idefics3(released, depth), idefics3_inputs, grids, ("auto", "packed"))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="towers to run (Qwen2-VL, Qwen2.5-VL, Pixtral, SigLIP2, Idefics3)")
    ap.add_argument("--released", action="store_true", help="the smallest released size's width, heads and MLP")
    ap.add_argument("--depth", type=int, default=DEPTH, help="blocks")
    ap.add_argument("--batches", nargs="*", help="batch labels to run (default: all)")
    args = ap.parse_args(argv)
    positive_args(ap, args, "threads", "rounds", "depth")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    widths = "released widths " + str(RELEASED) if args.released else f"width {WIDTH}, {HEADS} heads"
    print(f"machine: {machine()}; {widths}, {args.depth} blocks, {args.rounds} interleaved rounds")
    print("| tower | batch | path | fwd ms (orig) | fwd ratio [IQR] | fwd+bwd ms (orig) | fwd+bwd ratio [IQR] "
          "| fwd CPU-time ratio | fwd+bwd CPU-time ratio | max err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for tower, build, inputs, cases, paths in batches(args.released, args.depth):
        if args.only and tower not in args.only:
            continue
        orig = build()
        conv = convert_vit(orig)
        for (label, sizes), path in ((c, p) for c in cases.items() for p in paths):
            if args.batches and label not in args.batches:
                continue
            conv.path = path
            a = inputs(orig, sizes)
            rows = valid_rows(tower, a)
            with torch.no_grad():
                diff = conv(*a).last_hidden_state - orig(*a).last_hidden_state
                err = (diff if rows is None else diff[rows]).abs().max().item()

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
                  f"| {ratio(t, 'cf', 'of', 'cpu'):.2f}x | {ratio(t, 'cb', 'ob', 'cpu'):.2f}x | {err:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
