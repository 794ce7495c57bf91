"""Parity of vispe's converted vision towers (``convert_vit``, ``vispe.models.towers``) against the
reference library, every parameter redrawn: the largest absolute difference of each output field
on each input, and the largest output for scale. One entry per tower in ``TOWERS``.

    flock /work/heavy.lock .venv/bin/python results/compare/parity_towers.py > results/compare/parity_towers.md
    .venv/bin/python results/compare/parity_towers.py --sizes tiny --only pixtral   # the tests' small configs

No download: each model is built from a config with random weights, at the released model's size
(``full``) or a tiny one (``tiny``, what ``tests/test_towers.py`` runs). Adding a tower is one
``Entry``: its name, a builder ``build(size) -> model`` and ``cases(model, size, g) -> [Case]`` (the inputs,
in the original's call, with a label); ``fields`` are the output fields compared.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vispe

from vispe.models.vit import convert_vit  # noqa: E402

SIZES = ("tiny", "full")


class Case(NamedTuple):
    label: str  # what the input is, for the table
    args: tuple
    kwargs: dict = {}


class Entry(NamedTuple):
    name: str  # short key (--only)
    title: str  # the reference class, for the table
    build: Callable[[str], torch.nn.Module]  # size -> the original, random weights
    cases: Callable[[torch.nn.Module, str, torch.Generator], list]  # (original, size, generator) -> [Case]
    fields: tuple = ("last_hidden_state",)


def redraw(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter redrawn: norm weights in [0.5, 1.5], matrices N(0, 1/fan_in), the rest N(0, 0.2^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() >= 2 and "embedding" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


# --- Qwen2-VL / Qwen2.5-VL: packed patches (T, C*t*p*p) and grid_thw ------------------------------
def _qwen_cases(grids: dict) -> Callable:
    def cases(model, size: str, g: torch.Generator) -> list:
        cfg, out = model.config, []
        for label, thw in grids[size]:
            thw = torch.tensor(thw)
            x = torch.randn(int(thw.prod(-1).sum()), cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2,
                            generator=g)
            out.append(Case(label, (x, thw)))
        return out
    return cases


def _qwen2_vl(size: str):
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    kw = dict(depth=2, embed_dim=32, hidden_size=48, num_heads=4, mlp_ratio=2, patch_size=2) if size == "tiny" else {}
    return redraw(Qwen2VisionTransformerPretrainedModel(Qwen2VLVisionConfig(**kw)))


def _qwen2_5_vl(size: str):
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    if size == "tiny":  # windows of 8 px = 2 x 2 merged tokens = 4 x 4 patches; full attention in block 1
        kw = dict(depth=3, hidden_size=32, out_hidden_size=48, num_heads=4, intermediate_size=64, patch_size=2,
                  window_size=8, fullatt_block_indexes=[1])
    else:  # Qwen2.5-VL-7B's vision tower (the config class defaults hidden_size to the text width)
        kw = dict(hidden_size=1280, intermediate_size=3420, out_hidden_size=3584, num_heads=16)
    return redraw(Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**kw)))


def _qwen3_vl(size: str):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    if size == "tiny":  # a 5 x 5 learned table resized to every frame; DeepStack after blocks 0 and 1
        kw = dict(depth=3, hidden_size=32, out_hidden_size=48, num_heads=4, intermediate_size=64, patch_size=2,
                  num_position_embeddings=25, deepstack_visual_indexes=[0, 1])
    else:  # the config's defaults: Qwen3-VL's 27-block, 1152-wide tower, 48 x 48 table
        kw = {}
    return redraw(Qwen3VLVisionModel(Qwen3VLVisionConfig(**kw)))


QWEN2_GRIDS = {
    "tiny": [("one image 6x6 patches", [[1, 6, 6]]), ("one image 4x10", [[1, 4, 10]]),
             ("packed: 8x4, 2x6, video 2 frames 4x4", [[1, 8, 4], [1, 2, 6], [2, 4, 4]])],
    "full": [("one image 16x16 patches", [[1, 16, 16]]), ("one image 12x20", [[1, 12, 20]]),
             ("packed: 20x8, 8x16, video 2 frames 8x8", [[1, 20, 8], [1, 8, 16], [2, 8, 8]])],
}
QWEN25_GRIDS = {
    "tiny": [("one image 8x8 patches (4 windows)", [[1, 8, 8]]), ("one image 6x10 (partial windows)", [[1, 6, 10]]),
             ("packed: 10x6, 4x12, video 2 frames 6x4", [[1, 10, 6], [1, 4, 12], [2, 6, 4]])],
    "full": [("one image 16x16 patches (4 windows)", [[1, 16, 16]]), ("one image 12x28 (partial windows)", [[1, 12, 28]]),
             ("packed: 20x12, 8x24, video 2 frames 12x8", [[1, 20, 12], [1, 8, 24], [2, 12, 8]])],
}


# --- Pixtral: a padded image batch and image_sizes --------------------------------------------------
def _pixtral(size: str):
    from transformers import PixtralVisionConfig, PixtralVisionModel

    kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=64,
              patch_size=4) if size == "tiny" else {}
    return redraw(PixtralVisionModel(PixtralVisionConfig(**kw)))


def _pixtral_cases(model, size: str, g: torch.Generator) -> list:
    p = model.config.patch_size
    sq, (h, w) = 6 * p, (4 * p, 10 * p)
    return [Case(f"2 images {sq}x{sq} px", (torch.randn(2, 3, sq, sq, generator=g),)),
            Case(f"2 images {h}x{w} px", (torch.randn(2, 3, h, w, generator=g),)),
            Case(f"packed: {8 * p}x{3 * p} and {2 * p + 1}x{9 * p} px in a {8 * p}x{9 * p} batch",
                 (torch.randn(2, 3, 8 * p, 9 * p, generator=g), torch.tensor([[8 * p, 3 * p], [2 * p + 1, 9 * p]])))]


# --- Llama 4 vision: a fixed square size per config --------------------------------------------------
def _llama4(size: str, image_size: int | None = None):
    from transformers import Llama4VisionConfig
    from transformers.models.llama4.modeling_llama4 import Llama4VisionModel

    if size == "tiny":
        kw = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, patch_size=8,
                  image_size=image_size or 32, projector_input_dim=64, projector_output_dim=64, vision_output_dim=32)
    else:  # Llama 4 Scout's vision encoder (the config class's defaults do not run: 768 * 4 != 5632)
        kw = dict(hidden_size=1408, intermediate_size=5632, vision_output_dim=4096, image_size=image_size or 336)
    return redraw(Llama4VisionModel(Llama4VisionConfig(**kw)))


def _llama4_cases(model, size: str, g: torch.Generator) -> list:
    n = model.config.image_size
    return [Case(f"2 images {n}x{n} px (the config's size; the original takes no other)",
                 (torch.randn(2, 3, n, n, generator=g),))]



def _redraw_sam_tables(model: torch.nn.Module, seed: int = 2) -> torch.nn.Module:
    """SAM's position tables (``pos_embed`` (1, gh, gw, C), ``rel_pos_h`` / ``rel_pos_w``) redrawn N(0, 0.2^2):
    ``redraw`` would give them N(0, 1/fan_in), about 6e-4 for the absolute table, too small to show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "pos_embed" in name or "rel_pos" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


# --- SAM: transformers' SamVisionEncoder (its configured square size only) and timm's VisionTransformerSAM
def _hf_sam(size: str, image_size: int | None = None):
    from transformers import SamVisionConfig
    from transformers.models.sam.modeling_sam import SamVisionEncoder

    if size == "tiny":  # the tests' config: 4x4 px patches, windows of 3 (8 -> padded to 9), global blocks 1, 3
        kw = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, mlp_dim=48, image_size=image_size or 32,
                  patch_size=4, window_size=3, global_attn_indexes=[1, 3], output_channels=16)
    else:  # SAM ViT-B: 1024 px, windows of 14, global blocks 2, 5, 8, 11
        kw = dict(image_size=image_size or 1024)
    return _redraw_sam_tables(redraw(SamVisionEncoder(SamVisionConfig(**kw))))


def _hf_sam_cases(model, size: str, g: torch.Generator) -> list:
    n, p, w = model.config.image_size, model.config.patch_size, model.config.window_size
    pad = "windows padded" if (n // p) % w else "windows exact"
    return [Case(f"2 images {n}x{n} px ({n // p}x{n // p} patches, {pad}; the original takes no other size)",
                 (torch.randn(2, 3, n, n, generator=g),), dict(output_hidden_states=True))]


def _timm_sam(size: str):
    from timm.models.vision_transformer_sam import VisionTransformerSAM

    if size == "tiny":
        kw = dict(img_size=(24, 40), patch_size=4, embed_dim=32, depth=4, num_heads=2, mlp_ratio=1.5, window_size=3,
                  global_attn_indexes=(1, 3), neck_chans=16, qk_norm=True, init_values=0.5)
    else:  # timm's samvit_base_patch16 (ViT-B, 1024 px)
        kw = dict(img_size=1024, patch_size=16, embed_dim=768, depth=12, num_heads=12, window_size=14,
                  global_attn_indexes=(2, 5, 8, 11), neck_chans=256)
    # no classifier, no pooling: forward returns the neck's (B, C, h, w) map, every cell compared
    return _redraw_sam_tables(redraw(VisionTransformerSAM(use_rel_pos=True, num_classes=0, global_pool="", **kw)))


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
    "qwen2_vl": Entry("qwen2_vl", "transformers `Qwen2VisionTransformerPretrainedModel`", _qwen2_vl,
                      _qwen_cases(QWEN2_GRIDS),
                      ("last_hidden_state", "pooler_output")),
    "qwen2_5_vl": Entry("qwen2_5_vl", "transformers `Qwen2_5_VisionTransformerPretrainedModel`", _qwen2_5_vl,
                        _qwen_cases(QWEN25_GRIDS),
                        ("last_hidden_state", "pooler_output")),
    "qwen3_vl": Entry("qwen3_vl", "transformers `Qwen3VLVisionModel`", _qwen3_vl, _qwen_cases(QWEN2_GRIDS),
                      ("last_hidden_state", "pooler_output", "deepstack_features")),
    "pixtral": Entry("pixtral", "transformers `PixtralVisionModel`", _pixtral, _pixtral_cases),
    "llama4": Entry("llama4", "transformers `Llama4VisionModel`", _llama4, _llama4_cases),
    "llama4_b": Entry("llama4_b", "transformers `Llama4VisionModel`, a second config size",
                      lambda size: _llama4(size, 48 if size == "tiny" else 448), _llama4_cases),
    # SAM, SigLIP2, Idefics3 (branch i37b): the position tables of SAM are redrawn too (_redraw_sam_tables)
    "hf_sam": Entry("hf_sam", "transformers `SamVisionEncoder`", _hf_sam, _hf_sam_cases),
    "hf_sam_b": Entry("hf_sam_b", "transformers `SamVisionEncoder`, a second config size",
                      lambda size: _hf_sam(size, 24 if size == "tiny" else 512), _hf_sam_cases),
    "timm_sam": Entry("timm_sam", "timm `VisionTransformerSAM` (`forward`: the neck's map, no head)", _timm_sam,
                      _timm_sam_cases, ("",)),
    "siglip2": Entry("siglip2", "transformers `Siglip2VisionModel`", _siglip2, _siglip2_cases,
                     ("last_hidden_state", "pooler_output")),
    "idefics3": Entry("idefics3", "transformers `Idefics3VisionTransformer`", _idefics3, _idefics3_cases),
}


def errors(entry: Entry, size: str = "tiny", seed: int = 1, original=None):
    """``[(case label, field, max abs difference, max abs output)]`` of ``entry`` at ``size``."""
    original = entry.build(size) if original is None else original
    model = convert_vit(original).eval()  # a tower converter leaves the original untouched (vispe.models.towers)
    out = []
    for case in entry.cases(original, size, torch.Generator().manual_seed(seed)):
        with torch.no_grad():
            want, got = original(*case.args, **case.kwargs), model(*case.args, **case.kwargs)
        if type(got) is not type(want):
            raise AssertionError(f"{entry.name}: the converted model returns {type(got).__name__}, "
                                 f"the original {type(want).__name__}")
        for f in entry.fields:
            a, b = (getattr(got, f), getattr(want, f)) if f else (got, want)  # "": the output itself (timm)
            if isinstance(b, (list, tuple)):  # a list of tensors (Qwen3-VL's deepstack_features)
                if len(a) != len(b):
                    raise AssertionError(f"{entry.name}: {f} has {len(a)} tensors, the original's {len(b)}")
                a, b = torch.cat([t.flatten() for t in a]), torch.cat([t.flatten() for t in b])
            out.append((case.label, f or "output", (a - b).abs().max().item(), b.abs().max().item()))
    return out


def machine() -> str:
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
    except OSError:
        names = []
    return f"{os.cpu_count()}-core {names[0] if names else 'CPU'}, no GPU used"


def main(argv=None) -> int:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", choices=SIZES, default=["full", "tiny"],
                    help="full: the released models' sizes (minutes: run it under flock /work/heavy.lock); "
                         "tiny: the tests' configs (seconds)")
    ap.add_argument("--only", nargs="*", choices=sorted(TOWERS), help="these entries only")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    cmd = "python results/compare/parity_towers.py" + \
        (f" --sizes {' '.join(args.sizes)}" if args.sizes != ap.get_default("sizes") else "") + \
        (f" --only {' '.join(args.only)}" if args.only else "")
    print("# Parity of the converted vision towers (random weights)\n")
    print(f"`{cmd}` at commit {commit}; {machine()} (other jobs shared it), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, float32 on CPU. Every parameter redrawn (norm weights in "
          "[0.5, 1.5], matrices N(0, 1/fan_in), the rest N(0, 0.04)). Each row: the converted model "
          "(`convert_vit(original)`) called with the original's arguments, against the original.")
    for size in args.sizes:
        torch.manual_seed(0)
        print("\n## " + ("The released models' sizes (default configs; Qwen2.5-VL at 7B's vision width, Llama 4 "
                         "Scout's encoder)" if size == "full" else "The tests' tiny configs (tests/test_towers.py)") + "\n")
        print("| reference | input | field | max abs difference | max abs output |\n|---|---|---|---|---|")
        for name in args.only or TOWERS:
            entry = TOWERS[name]
            for label, f, err, scale in errors(entry, size):
                print(f"| {entry.title} | {label} | `{f}` | {err:.1e} | {scale:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
