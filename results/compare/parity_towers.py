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
    convert: Callable | None = None  # original -> converted model; None: convert_vit(original)


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


# --- EoMT and EoMT-DINOv3 (issue 50): the whole segmenter, queries and mask head -------------------------
EOMT_FIELDS = ("masks_queries_logits", "class_queries_logits", "last_hidden_state")


def _eomt(size: str, dinov3: bool = False):
    import transformers as tf

    if size == "tiny":  # the tests' config (tests/test_towers_eomt.py)
        kw = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=32, patch_size=4,
                  num_register_tokens=2, num_queries=5, num_blocks=2, num_upscale_blocks=2, num_labels=3)
    else:  # EoMT-L's width, queries and 640 px input (40x40 patches), 6 of its 24 layers (a shared 2-core CPU)
        kw = dict(num_hidden_layers=6)
    if dinov3:
        cfg = tf.EomtDinov3Config(**kw, **(dict(intermediate_size=64) if size == "tiny" else {}))
        return redraw(tf.EomtDinov3ForUniversalSegmentation(cfg))
    return redraw(tf.EomtForUniversalSegmentation(tf.EomtConfig(**kw, **(dict(mlp_ratio=2) if size == "tiny" else {}))))


def _eomt_dinov3_wide(size: str):
    """EoMT-DINOv3 with its head's grid set to twice the config's width: transformers at that size."""
    model = _eomt(size, dinov3=True)
    n = model.config.image_size // model.config.patch_size
    model.grid_size = (n, 2 * n)
    return model


def _eomt_cases(model, size: str, g: torch.Generator) -> list:
    n = model.config.image_size
    h, w = (n, n * model.grid_size[1] // model.grid_size[0])
    note = "(the config's size; the original takes no other)" if h == w else "(the original with its head's grid set)"
    return [Case(f"2 images {h}x{w} px {note}", (torch.randn(2, 3, h, w, generator=g),))]


# --- SAM 3's ViT (issue 50): RoPE with a [w, h] buffer, a tiled table, windows ------------------------
def _sam3_vit(size: str, image_size=None):
    from transformers import Sam3ViTConfig
    from transformers.models.sam3.modeling_sam3 import Sam3ViTModel

    if size == "tiny":  # the tests' config: 14x14 patches, windows of 3, a 6x6 table tiled
        kw = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2, patch_size=4,
                  window_size=3, global_attn_indexes=[1, 3], pretrain_image_size=24, image_size=image_size or 56)
    else:  # SAM 3's width, 1008 px (72x72 patches, windows of 24, its 24x24 table tiled 3x3), 4 of its 32 layers
        kw = dict(num_hidden_layers=4, global_attn_indexes=[3], image_size=image_size or 1008)
    return redraw(Sam3ViTModel(Sam3ViTConfig(**kw)))


def _sam3_vit_wide(size: str):
    """SAM 3's ViT at twice its grid's width, its global layers' position buffer recomputed there
    (index * window / (h, w), (x, y) columns): what vispe's default rope_positions="interpolate" computes."""
    model = _sam3_vit(size)
    n = model.config.image_size // model.config.patch_size
    ws = model.config.window_size
    y, x = torch.meshgrid(torch.arange(n), torch.arange(2 * n), indexing="ij")
    for layer in model.layers:
        if not layer.window_size:
            layer.position_ids = torch.stack([x.flatten() * ws / (2 * n), y.flatten() * ws / n], dim=-1)
    model.wide = True
    return model


def _sam3_cases(model, size: str, g: torch.Generator) -> list:
    s = model.config.image_size
    h, w = (s, s) if isinstance(s, int) else tuple(s)
    note = "the config's size; the original takes no other"
    if getattr(model, "wide", False):
        w, note = 2 * w, "the original with its position buffer recomputed for the grid"
    return [Case(f"2 images {h}x{w} px ({note})", (torch.randn(2 if size == "tiny" else 1, 3, h, w, generator=g),))]


def _sam3_transformers_layout(model):
    from vispe.models.towers.sam3 import convert_sam3_vit

    return convert_sam3_vit(model, rope_positions="transformers")


# --- SAM 2's Hiera (issue 50): background table resized + window table repeated ----------------------
def _hiera(size: str):
    from transformers import Sam2HieraDetConfig
    from transformers.models.sam2.modeling_sam2 import Sam2HieraDetModel

    if size == "tiny":  # the tests' config (tests/test_towers_sam2_hiera.py)
        kw = dict(hidden_size=16, num_attention_heads=1, image_size=[64, 64], patch_kernel_size=[7, 7],
                  patch_stride=[4, 4], patch_padding=[3, 3], query_stride=[2, 2],
                  window_positional_embedding_background_size=[3, 3], num_query_pool_stages=2,
                  blocks_per_stage=[1, 2, 2, 1], embed_dim_per_stage=[16, 32, 64, 128],
                  num_attention_heads_per_stage=[1, 2, 4, 8], window_size_per_stage=[8, 4, 2, 2],
                  global_attention_blocks=[4, 5], mlp_ratio=2.0)
    else:  # the config's defaults: SAM 2.1 Hiera-B+ at 1024 px
        kw = {}
    return _redraw_sam_tables(redraw(Sam2HieraDetModel(Sam2HieraDetConfig(**kw))))


def _hiera_off_grid(size: str):
    """Hiera on a grid that is not a multiple of its window, its code written out (background resized,
    the window table repeated from the corner and cropped): the original's blocks, vispe's rule."""
    import torch.nn.functional as F

    model = _hiera(size)

    def code(hw):
        bg = F.interpolate(model.pos_embed, size=tuple(hw), mode="bicubic", align_corners=False)
        a, b = model.pos_embed_window.shape[-2:]
        win = model.pos_embed_window.repeat(1, 1, -(-hw[0] // a), -(-hw[1] // b))[..., :hw[0], :hw[1]]
        return (bg + win).permute(0, 2, 3, 1)
    model._get_pos_embed = code
    model.off_grid = True
    return model


def _hiera_cases(model, size: str, g: torch.Generator) -> list:
    n = model.config.image_size[0]
    if getattr(model, "off_grid", False):
        h, w = (48, 80) if size == "tiny" else (1040, 1296)  # 12x20 / 260x324 patches, windows of 8
        return [Case(f"1 image {h}x{w} px (the original with the code at any grid written out)",
                     (torch.randn(1, 3, h, w, generator=g),))]
    return [Case(f"1 image {n}x{n} px (its size)", (torch.randn(1, 3, n, n, generator=g),)),
            Case(f"1 image {n * 3 // 2}x{n} px (a non-square size it runs)", (torch.randn(1, 3, n * 3 // 2, n, generator=g),))]


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
    # issue 50: segmentation towers at any size
    "eomt": Entry("eomt", "transformers `EomtForUniversalSegmentation`", _eomt, _eomt_cases, EOMT_FIELDS),
    "eomt_dinov3": Entry("eomt_dinov3", "transformers `EomtDinov3ForUniversalSegmentation`",
                         lambda size: _eomt(size, dinov3=True), _eomt_cases, EOMT_FIELDS),
    "eomt_dinov3_wide": Entry("eomt_dinov3_wide", "transformers `EomtDinov3ForUniversalSegmentation`, twice the width",
                              _eomt_dinov3_wide, _eomt_cases, EOMT_FIELDS),
    "sam3_vit": Entry("sam3_vit", "transformers `Sam3ViTModel`", _sam3_vit, _sam3_cases),
    "sam3_vit_nonsquare": Entry("sam3_vit_nonsquare", "transformers `Sam3ViTModel`, a non-square config "
                                "(`rope_positions=\"transformers\"`)",
                                lambda size: _sam3_vit(size, [48, 72] if size == "tiny" else [1008, 1344]),
                                _sam3_cases, convert=_sam3_transformers_layout),
    "sam3_vit_wide": Entry("sam3_vit_wide", "transformers `Sam3ViTModel`, twice the width", _sam3_vit_wide,
                           _sam3_cases),
    "hiera": Entry("hiera", "transformers `Sam2HieraDetModel`", _hiera, _hiera_cases,
                   ("last_hidden_state", "intermediate_hidden_states")),
    "hiera_off_grid": Entry("hiera_off_grid", "transformers `Sam2HieraDetModel`, a grid off the window multiples",
                            _hiera_off_grid, _hiera_cases, ("last_hidden_state", "intermediate_hidden_states")),
}


def errors(entry: Entry, size: str = "tiny", seed: int = 1, original=None):
    """``[(case label, field, max abs difference, max abs output)]`` of ``entry`` at ``size``."""
    original = entry.build(size) if original is None else original
    model = (entry.convert or convert_vit)(original).eval()  # the original is left untouched (vispe.models.towers)
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
