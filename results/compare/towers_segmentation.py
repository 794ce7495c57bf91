"""The segmentation towers for results/compare/parity_towers.py: SAM (transformers' and timm's), EoMT and
EoMT-DINOv3, SAM 3's ViT, SAM 2's Hiera. Each: a builder ``_<name>(size) -> original`` (random weights, ``tiny`` or
the released ``full`` config) and ``_<name>_cases(model, size, g) -> [Case]``."""
from __future__ import annotations

import torch

from tower_cases import Case, redraw  # beside this file

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
