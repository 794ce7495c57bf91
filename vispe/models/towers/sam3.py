"""SAM 3's image encoder converted to vispe: transformers' ``Sam3ViTModel`` (the ViT inside
``Sam3VisionModel`` / ``Sam3Model``), through ``convert_vit(model)`` or ``convert_sam3_vit``.
``convert_vit`` of a ``Sam3VisionModel`` or a whole ``Sam3Model`` returns a copy of it whose ViT
(``backbone``) is converted and the rest is the original's: the whole model then runs at any size
(its FPN neck, DETR and mask decoder take any grid; its ViT was what failed).

Its position handling (transformers 5.23, ``modeling_sam3.py``), and what vispe does at any size:

* A learned table ``position_embeddings`` (1, g0*g0, C) over the *pre-training* grid (g0 =
  ``pretrain_image_size / patch``, 24 for the released model) is **tiled** to the grid (a 72 x 72 grid
  reads it 3 x 3 times, from the top-left corner, cropped): the original's rule, kept at every size
  (``table="tile"``, default); ``table="interpolate"`` resamples it instead (``learned_abs``'s rule:
  target size, bicubic, antialias when shrinking), which at the native size is *not* the original.
* Axial RoPE in every layer, interleaved pairs (``rotate_pairwise``), frequencies
  ``theta^(-4j/head_dim)``, one set per axis; each layer rotates with a fixed buffer
  (``precompute_positions``) of ``(x, y)`` indices: the **x channels first** (stored [w, h], although
  transformers' comment says h first: ``axis_order="xy"`` reproduces it), scaled by
  ``window_size / h0`` (h0 = the config grid's height: transformers' ``hw_grid`` is (w0, h0) and it
  divides by ``hw_grid[1]``; 1 in windowed layers): position
  interpolation of the global grid onto the window's range. The buffer fixes the config's grid, so the
  original fails at any other size. vispe computes the positions for the input's grid, by
  ``rope_positions``:

  - ``"interpolate"`` (default): SAM 3's convention at the input's grid, each axis spanning the
    window's range: ``rope_axial(ref_grid=(ws, ws))``, (y, x) index * ws / (h, w) (with a padding mask,
    the valid extent);
  - ``"extend"``: the native spacing kept, index * ws / h0 on both axes: larger grids
    reach angles the model never saw;
  - ``"transformers"``: ``"extend"`` read as transformers' buffer is laid out: the global layers see
    the grid as (w, h) in raster order (its ``hw_grid`` is (w, h) and its meshgrid fills it row by
    row), which on a non-square grid gives each token another token's position. It is the original's
    output at a non-square config size (which transformers runs); on a square grid all three agree.

* Windowed layers (``window_size``, all but ``global_attn_indexes``) pad the (h, w) grid with zero
  tokens to multiples of the window and attend inside (ws x ws) windows, cut in (y, x) order at any
  grid, square or not (SAM's ``SamBlock``, ``vispe.models.towers.sam``); their RoPE is the window's.

Any vispe encoding replaces the RoPE by name (``convert_vit(m, pe="rope_mixed")``; windowed layers get
one built for the window), and the table (kept next to it with ``keep_abs_pos=True``; ``pe="learned_abs"``
takes it over). ``pe_kwargs`` with ``pe=None`` change SAM 3's own RoPE (``{"axis_order": "yx"}``).
Padding mask (``mask=`` (B, H, W), True = padding) as the SAM converter: hidden keys, mask-aware
encodings over the valid area, ``window_padding`` "attend" (SAM's zero tokens are keys) or "mask".

``forward(pixel_values, mask=None, **kwargs)`` returns transformers' ``BaseModelOutput``:
``last_hidden_state`` (B, h*w, C); with ``output_hidden_states`` the first layer's input and every
layer's output, (B, h, w, C).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vispe import _checks
from vispe.image.learned_abs import LearnedAbsEncoding
from vispe.models.towers import register_tower
from vispe.models.towers._common import check_inv_freq, output_flags, vispe_attention
from vispe.models.towers.sam import SamBlock, SamTower
from vispe.registry import build_in

ROPE_POSITIONS = ("interpolate", "extend", "transformers")
TABLES = ("tile", "interpolate")


def tile_table(table: torch.Tensor, grid: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """A (1, g0*g1, C) table over ``grid`` repeated from the top-left corner over ``shape`` (h, w) and
    cropped (SAM 3's ``_tile_position_embeddings``).  # (1, h*w, C)"""
    (g0, g1), (h, w) = grid, shape
    t = table.reshape(1, g0, g1, -1)  # (1, g0, g1, C)
    t = t.repeat(1, -(-h // g0), -(-w // g1), 1)[:, :h, :w]  # (1, h, w, C)
    return t.reshape(1, h * w, -1)


class Sam3ViTTower(SamTower):
    """SAM 3's ViT with vispe attention and encodings (module docstring)."""

    #: "tile" (SAM 3's rule, default) or "interpolate": how the pre-training table meets the grid
    table: str = "tile"

    def input_code(self, x: torch.Tensor, shape, mask) -> tuple[torch.Tensor, None]:
        """Patch tokens (B, h*w, C) + the table (tiled or resampled) + an additive ``pe``."""
        if self.abs_pe is not None:
            if _checks.choice("table", self.table, TABLES) == "tile":
                code = tile_table(self.abs_pe.pos_embed, self.abs_pe.table_grid(), shape).to(x.dtype)
            else:
                code = self.abs_pe(shape, mask, device=x.device, dtype=x.dtype)  # (B|1, h*w, C)
            x = x + code
        if self.pe_family == "additive":
            x = x + self.pe(shape, mask, device=x.device, dtype=x.dtype)
        return x, None

    def _global_positions(self, mode: str, window: int, height0: int) -> None:
        """SAM 3's own RoPE in the global blocks, by ``rope_positions`` (module docstring)."""
        kw = dict(ref_grid=(window, window)) if mode == "interpolate" else dict(scale=window / height0)
        kw.update(self.pe_kwargs)  # the caller's settings win
        attn = self.blocks[0].attn
        context = dict(dim=attn.qkv.in_features, num_heads=attn.num_heads, head_dim=attn.head_dim,
                       grid=self.pe_grid, num_prefix_tokens=0)
        ref = next(self.parameters())
        for blk in self.blocks:
            if not blk.window_size:
                blk.attn.set_pe(build_in("rope_axial", context, **kw).to(device=ref.device, dtype=ref.dtype))
                blk.swap_global_axes = mode == "transformers"

    def forward(self, pixel_values: torch.Tensor, mask: torch.Tensor | None = None, **kwargs):
        """``pixel_values`` (B, C, H, W) -> ``BaseModelOutput`` as the original returns it."""
        from transformers.modeling_outputs import BaseModelOutput

        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        states = [] if hidden else None
        x, _ = self.encode(pixel_values, mask, name="pixel_values", states=states)  # (B, h, w, C)
        out = BaseModelOutput(last_hidden_state=x.flatten(1, 2), hidden_states=tuple(states) if hidden else None)
        return out if return_dict else out.to_tuple()


@register_tower("transformers", "Sam3ViTModel")
def convert_sam3_vit(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                     peg_blocks=(0,), keep_abs_pos: bool | None = None, rope_positions: str = "interpolate",
                     table: str = "tile") -> Sam3ViTTower:
    """A ``Sam3ViTTower`` with the weights of transformers' ``Sam3ViTModel`` (module docstring)."""
    cfg = model.config
    _checks.choice("rope_positions", rope_positions, ROPE_POSITIONS)
    _checks.choice("table", table, TABLES)
    if keep_abs_pos is True and pe == "learned_abs":
        raise ValueError("keep_abs_pos=True with pe='learned_abs': the absolute table would be added twice")
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    theta = float(cfg.rope_parameters["rope_theta"])
    want = 1.0 / theta ** (torch.arange(0, head_dim // 2, 2, dtype=torch.float) / (head_dim // 2))
    check_inv_freq(model.layers[0].rotary_emb, "layers[0].rotary_emb", want, head_dim,
                   f"SAM 3's axial frequencies of base {theta}")
    blocks = []
    for layer in model.layers:
        a = layer.attention
        attn = vispe_attention(a.num_attention_heads, a.q_proj, a.k_proj, a.v_proj, a.o_proj)
        attn.attn_drop.p = float(a.attention_dropout)
        blocks.append(SamBlock(copy.deepcopy(layer.layer_norm1), attn, copy.deepcopy(layer.layer_norm2),
                               copy.deepcopy(layer.mlp), layer.window_size, drop_path2=copy.deepcopy(layer.dropout)))
    size = _checks.grid_shape("config.image_size", cfg.image_size)
    patch = _checks.grid_shape("config.patch_size", cfg.patch_size)
    grid = (size[0] // patch[0], size[1] // patch[1])
    emb = model.embeddings
    tower = Sam3ViTTower(patch_embed=copy.deepcopy(emb.patch_embeddings.projection), blocks=blocks,
                         neck=nn.Identity(), grid=grid, norm_pre=copy.deepcopy(model.layer_norm),
                         pos_drop=copy.deepcopy(emb.dropout))
    tower.config, tower.table = copy.deepcopy(cfg), table
    tower.rope_positions = rope_positions
    pos = emb.position_embeddings.detach()  # (1, g0*g0, C)
    g0 = int(round(pos.shape[1] ** 0.5))
    if g0 * g0 != pos.shape[1]:
        raise ValueError(f"embeddings.position_embeddings has {pos.shape[1]} rows: expected a square grid")
    tower.abs_pe = LearnedAbsEncoding(pos.shape[-1], grid=(g0, g0))
    tower.abs_pe.load_state_dict({"pos_embed": pos, "table_grid": torch.tensor((g0, g0))})
    tower.abs_pe.to(device=pos.device, dtype=pos.dtype)
    tower._native = "rope_axial"
    native = pe is None
    if native:  # SAM 3's RoPE; the global blocks' positions set below
        pe, pe_kwargs = "rope_axial", {**dict(base=theta, axis_order="xy", layout="interleaved"),
                                      **(pe_kwargs or {})}
    elif rope_positions != "interpolate":
        raise ValueError(f"rope_positions={rope_positions!r} with pe={pe!r}: it sets SAM 3's own RoPE (pe=None)")
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks,
                   keep_abs_pos=True if native and keep_abs_pos is None else keep_abs_pos)
    if native:
        tower._global_positions(rope_positions, cfg.window_size, grid[0])
    if not native and tower.pe_name == "learned_abs" and table == "tile":
        with torch.no_grad():  # the table taken over as the original reads it at the native grid
            tower.pe.pos_embed.copy_(tile_table(pos, (g0, g0), tower.pe.table_grid()))
    return tower.train(model.training)


def _with_converted_backbone(model, vision, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos):
    """A copy of ``model`` whose ``vision.backbone`` (a ``Sam3ViTModel``) is converted; the rest is the original's."""
    out = copy.deepcopy(model)
    holder = out.vision_encoder if vision == "vision_encoder" else out
    holder.backbone = convert_sam3_vit(holder.backbone, pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks,
                                       keep_abs_pos=keep_abs_pos)
    return out


@register_tower("transformers", "Sam3VisionModel")
def convert_sam3_vision(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                        peg_blocks=(0,), keep_abs_pos: bool | None = None):
    """A copy of transformers' ``Sam3VisionModel`` (ViT + FPN neck) with its ViT converted (``convert_sam3_vit``)."""
    return _with_converted_backbone(model, "self", pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos)


@register_tower("transformers", "Sam3Model")
def convert_sam3_model(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                       peg_blocks=(0,), keep_abs_pos: bool | None = None):
    """A copy of transformers' ``Sam3Model`` whose vision encoder's ViT is converted (``convert_sam3_vit``);
    text encoder, DETR, geometry encoder and mask decoder are the original's (copied)."""
    return _with_converted_backbone(model, "vision_encoder", pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos)
