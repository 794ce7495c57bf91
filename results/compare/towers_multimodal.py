"""The vision towers of vision-language models for results/compare/parity_towers.py: Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, Pixtral, Llama 4, SigLIP2 NaFlex, Idefics3. Each: a builder ``_<name>(size) -> original`` (random
weights, ``tiny`` or the released ``full`` config) and ``_<name>_cases(model, size, g) -> [Case]``."""
from __future__ import annotations

from typing import Callable

import torch

from tower_cases import Case, redraw  # beside this file

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
