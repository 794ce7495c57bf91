"""Parity of the converted SAM, SigLIP2 and Idefics3 towers (``convert_vit``, ``vispe.models.towers.sam``,
``.siglip2``, ``.idefics3``) against the reference libraries, every parameter redrawn: the largest absolute difference of
each output field on each input, and the largest output for scale. One ``Entry`` per tower in ``TOWERS``.

    .venv/bin/python results/compare/parity_towers_sam_siglip2.py > results/compare/parity_towers_sam_siglip2.md
    .venv/bin/python results/compare/parity_towers_sam_siglip2.py --tiny --only timm_sam   # the tests' configs

The entries follow ``results/compare/parity_towers.py``'s ``Entry(name, title, build, cases, fields)`` (branch
i37a, the rotary towers) so they can join its ``TOWERS``; one addition: a field ``""`` compares the output
itself (timm's SAM returns a tensor). No download: each model is built from a config with random weights,
at the released model's size (``full``: SAM ViT-B 1024 px, SigLIP2 base patch16 NaFlex) or a tiny one.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vispe

from vispe.models.vit import convert_vit  # noqa: E402


@dataclass
class Case:
    label: str  # what the input is, for the table
    args: tuple
    kwargs: dict = field(default_factory=dict)


@dataclass
class Entry:
    name: str  # short key (--only)
    title: str  # the reference class, for the table
    build: Callable[[str], torch.nn.Module]  # size -> the original, random weights
    cases: Callable[[torch.nn.Module, str, torch.Generator], list]  # (original, size, generator) -> [Case]
    fields: tuple = ("last_hidden_state",)


def redraw(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter redrawn: norm weights in [0.5, 1.5], position tables N(0, 0.2^2) (SAM's are zeros at
    init), other matrices N(0, 1/fan_in), the rest N(0, 0.2^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() >= 2 and not any(k in name for k in ("embedding", "pos_embed", "rel_pos")):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


# --- SAM: transformers' SamVisionEncoder (its configured square size only) and timm's VisionTransformerSAM
def _hf_sam(size: str, image_size: int | None = None):
    from transformers import SamVisionConfig
    from transformers.models.sam.modeling_sam import SamVisionEncoder

    if size == "tiny":  # the tests' config: 4x4 px patches, windows of 3 (8 -> padded to 9), global blocks 1, 3
        kw = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_dim=48, image_size=image_size or 32,
                  patch_size=4, window_size=3, global_attn_indexes=[1, 3], output_channels=16)
    else:  # SAM ViT-B: 1024 px, windows of 14, global blocks 2, 5, 8, 11
        kw = dict(image_size=image_size or 1024)
    return redraw(SamVisionEncoder(SamVisionConfig(**kw)))


def _hf_sam_cases(model, size: str, g: torch.Generator) -> list:
    n, p, w = model.config.image_size, model.config.patch_size, model.config.window_size
    pad = "windows padded" if (n // p) % w else "windows exact"
    return [Case(f"2 images {n}x{n} px ({n // p}x{n // p} patches, {pad}; the original takes no other size)",
                 (torch.randn(2, 3, n, n, generator=g),), dict(output_hidden_states=True))]


def _timm_sam(size: str):
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    if size == "tiny":
        kw = dict(img_size=(24, 40), patch_size=4, embed_dim=32, depth=4, num_heads=2, mlp_ratio=1.5, window_size=3,
                  global_attn_indexes=(1, 3), neck_chans=16, num_classes=5, qk_norm=True, init_values=0.5)
    else:  # timm's samvit_base_patch16 (ViT-B, 1024 px) with a classifier
        kw = dict(img_size=1024, patch_size=16, embed_dim=768, depth=12, num_heads=12, window_size=14,
                  global_attn_indexes=(2, 5, 8, 11), neck_chans=256, num_classes=10)
    return redraw(VisionTransformerSAM(use_rel_pos=True, **kw))


def _timm_sam_cases(model, size: str, g: torch.Generator) -> list:
    h, w = model.patch_embed.img_size
    s = (32, 32) if size == "tiny" else (768, 512)
    return [Case(f"2 images {h}x{w} px (its size)", (torch.randn(2, 3, h, w, generator=g),)),
            Case(f"2 images {s[0]}x{s[1]} px (abs table resampled, global relative tables resized)",
                 (torch.randn(2, 3, *s, generator=g),))]


# --- SigLIP2 NaFlex: packed patches, pixel_attention_mask, spatial_shapes -----------------------------
def _siglip2(size: str):
    from transformers import Siglip2VisionConfig
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionModel

    kw = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, num_patches=16,
              patch_size=4) if size == "tiny" else dict(num_patches=256, patch_size=16)  # siglip2-base-patch16-naflex
    return redraw(Siglip2VisionModel(Siglip2VisionConfig(**kw)))


def _siglip2_cases(model, size: str, g: torch.Generator) -> list:
    d = model.config.num_channels * model.config.patch_size ** 2
    batches = {"tiny": [(24, [[3, 6], [5, 2]]), (20, [[4, 4], [2, 7]])],
               "full": [(256, [[12, 21], [24, 10]]), (256, [[16, 16], [7, 36]])]}[size]
    out = []
    for L, shapes in batches:
        mask = torch.zeros(len(shapes), L, dtype=torch.long)
        for b, (h, w) in enumerate(shapes):
            mask[b, :h * w] = 1
        x = torch.randn(len(shapes), L, d, generator=g) * mask[..., None]
        label = f"packed: {' and '.join(f'{h}x{w}' for h, w in shapes)} patches in {L} slots (padded slots compared)"
        out.append(Case(label, (x, mask, torch.tensor(shapes))))
    return out


# --- Idefics3: padded images and patch_attention_mask (NaViT's bucketed positions) --------------------
def _idefics3(size: str):
    from transformers import Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer

    kw = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=20,
              patch_size=4) if size == "tiny" else dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                                       num_attention_heads=16, image_size=364, patch_size=14)  # Idefics3-8B
    return redraw(Idefics3VisionTransformer(Idefics3VisionConfig(**kw)))


def _idefics3_cases(model, size: str, g: torch.Generator) -> list:
    p = model.config.patch_size
    (H, W), shapes = ((7, 9), [(7, 3), (2, 9)]) if size == "tiny" else ((26, 32), [(26, 15), (11, 32)])
    pm = torch.zeros(len(shapes), H, W, dtype=torch.bool)
    for b, (h, w) in enumerate(shapes):
        pm[b, :h, :w] = True
    x = torch.randn(len(shapes), 3, H * p, W * p, generator=g) * pm.repeat_interleave(p, 1).repeat_interleave(p, 2)[:, None]
    n = model.config.image_size // p
    return [Case(f"padded: {' and '.join(f'{h}x{w}' for h, w in shapes)} patches in {H}x{W} (table {n}x{n})", (x, pm)),
            Case(f"2 images {n}x{n} patches, no mask", (torch.randn(2, 3, n * p, n * p, generator=g),))]


TOWERS = {
    "hf_sam": Entry("hf_sam", "transformers `SamVisionEncoder`", _hf_sam, _hf_sam_cases, ("last_hidden_state",)),
    "hf_sam_b": Entry("hf_sam_b", "transformers `SamVisionEncoder`, a second config size",
                      lambda size: _hf_sam(size, 24 if size == "tiny" else 512), _hf_sam_cases, ("last_hidden_state",)),
    "timm_sam": Entry("timm_sam", "timm `VisionTransformerSAM` (logits)", _timm_sam, _timm_sam_cases, ("",)),
    "siglip2": Entry("siglip2", "transformers `Siglip2VisionModel`", _siglip2, _siglip2_cases,
                     ("last_hidden_state", "pooler_output")),
    "idefics3": Entry("idefics3", "transformers `Idefics3VisionTransformer`", _idefics3, _idefics3_cases),
}


def errors(entry: Entry, size: str = "tiny", seed: int = 1, original=None):
    """``[(case label, field, max abs difference, max abs output)]`` of ``entry`` at ``size``."""
    original = entry.build(size) if original is None else original
    model = convert_vit(copy.deepcopy(original)).eval()
    out = []
    for case in entry.cases(original, size, torch.Generator().manual_seed(seed)):
        with torch.no_grad():
            want, got = original(*case.args, **case.kwargs), model(*case.args, **case.kwargs)
        if type(got) is not type(want):
            raise AssertionError(f"{entry.name}: the converted model returns {type(got).__name__}, "
                                 f"the original {type(want).__name__}")
        for f in entry.fields:
            a, b = (getattr(got, f), getattr(want, f)) if f else (got, want)
            out.append((case.label, f or "output", (a - b).abs().max().item(), b.abs().max().item()))
    return out


def machine() -> str:
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
    except OSError:
        names = []
    return f"{os.cpu_count()}-core {names[0] if names else 'CPU'}, no GPU used"


def main(argv=None) -> int:
    import timm
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the tests' small configs instead of the released sizes")
    ap.add_argument("--only", nargs="*", choices=sorted(TOWERS), help="these entries only")
    args = ap.parse_args(argv)
    size = "tiny" if args.tiny else "full"
    torch.manual_seed(0)
    rows = []
    for name in args.only or TOWERS:
        entry = TOWERS[name]
        for label, f, err, scale in errors(entry, size):
            rows.append(f"| {entry.title} | {label} | `{f}` | {err:.1e} | {scale:.2f} |")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    cmd = "python results/compare/parity_towers_sam_siglip2.py" + (" --tiny" if args.tiny else "") + \
        (f" --only {' '.join(args.only)}" if args.only else "")
    print("# Parity of the converted SAM, SigLIP2 and Idefics3 towers (random weights)\n")
    print(f"`{cmd}` at commit {commit}; {machine()} (other jobs shared it), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, timm {timm.__version__}, float32 on CPU. Every parameter redrawn "
          f"(norm weights in [0.5, 1.5], position tables N(0, 0.04), other matrices N(0, 1/fan_in), the rest "
          f"N(0, 0.04)); {size} configs" + (" (the released models' sizes)" if size == "full" else
                                             " (those of tests/test_towers_sam.py, test_towers_siglip2.py)") + ".\n")
    print("| reference | input | field | max abs difference | max abs output |\n|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
