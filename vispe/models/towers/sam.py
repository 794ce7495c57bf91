"""SAM's image encoder converted to vispe: transformers' ``SamVisionEncoder`` and timm's SAM ViTs
(``vision_transformer_sam.VisionTransformerSAM``, ``samvit_*``), through ``convert_vit(model)``.

Its position convention (Kirillov et al., 2023; ViTDet's plain backbone, Li et al., 2022):

* an absolute learned table ``pos_embed`` (1, gh, gw, C) added after the patch embedding (timm
  resamples it at other sizes, bicubic with antialias: ``learned_abs(interpolation="bicubic",
  antialias="always")``; transformers refuses other sizes, the converted model resamples as timm);
* in every block, SAM's decomposed relative position (``rel_pos_h`` (2n-1, head_dim), ``rel_pos_w``),
  read by the query: vispe's ``relpos_decomposed`` encoding, one per block, built for the block's grid;
* windowed blocks (``window_size``) with global blocks between (``global_attn_indexes``): a windowed
  block pads the (h, w) grid with zero tokens up to multiples of the window, attends inside each
  window (its relative tables are the window's), and crops back; then the conv neck (1x1 conv,
  LayerNorm2d, 3x3 conv, LayerNorm2d) gives (B, out_chans, h, w).

``SamTower`` runs that with vispe's ``Attention`` (the same ``qkv`` / ``proj`` weights, copied) and
the original's norms, MLPs and neck (copied; the original is left untouched). Windows are handled
as the original: the same partition (timm's ``window_partition``), each window a (ws, ws) grid for
the encoding. Any other vispe encoding runs by name (``convert_vit(sam, pe="rope_axial")``): a
rotary or bias encoding goes in every block (built for the window in windowed blocks), an additive
one is added after the patch embedding, PEG after ``peg_blocks``; a named encoding replaces the
relative position and the absolute table (``learned_abs`` takes the table over), unless
``keep_abs_pos=True`` keeps the table next to it.

Padding mask (vispe's extension; ``mask`` (B, H, W), True = padding): padded patches are hidden from
attention, mask-aware encodings count positions over the valid area, and padded cells are zeroed
before each convolution of the neck (so its 3x3 conv sees at the border of the valid area what it
sees at the image's own border). The cells that fill the last windows are SAM's zero tokens, which
every query of the window attends to (``window_padding="attend"``, SAM's rule, the default); with
``window_padding="mask"`` they are hidden as padding, and then an image alone and the same image
padded at the bottom/right of a batch give the same features on its valid area wherever the encoding
is mask-aware (``relpos_decomposed`` is not: its global tables are resized to the canvas).

* ``SamVisionEncoderTower`` (from transformers): ``forward(pixel_values, mask=None, **kwargs)``
  returns ``SamVisionEncoderOutput`` (``last_hidden_state`` (B, out, h, w); ``hidden_states``: the
  input of the first block and every block's output, (B, h, w, C), with ``output_hidden_states``;
  ``return_dict=False``: the tuple). ``output_attentions=True`` is refused (fused attention).
* ``SamViTTower`` (from timm): ``forward``, ``forward_features`` (the neck's (B, C, h, w)),
  ``forward_head``, ``forward_intermediates`` as timm's, each taking ``mask=None``.

Refused, naming the part: timm's RoPE variant (``use_rope``), patch dropout, a patch-embedding norm,
attention weights.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vispe import _checks
from vispe.attention import PosContext
from vispe.image.learned_abs import LearnedAbsEncoding
from vispe.models._vit_inputs import patch_mask
from vispe.models.towers import register_tower
from vispe.models.towers._common import Tower, fused_attention, output_flags
from vispe.registry import build_in

WINDOW_PADDING = ("attend", "mask")


def partition_mask(mask: torch.Tensor, window: int) -> torch.Tensor:
    """A grid padding mask (B, h, w) padded with True to multiples of ``window`` and cut into windows
    as timm's ``window_partition`` cuts the tokens.  # (B * windows, window, window)"""
    B, h, w = mask.shape
    ph, pw = (-h) % window, (-w) % window
    m = nn.functional.pad(mask, (0, pw, 0, ph), value=True)  # (B, Hp, Wp)
    Hp, Wp = h + ph, w + pw
    m = m.view(B, Hp // window, window, Wp // window, window).permute(0, 1, 3, 2, 4)
    return m.reshape(-1, window, window)


class SamBlock(nn.Module):
    """SAM's block on (B, h, w, C) tokens: ``x + ls1(attn(norm1(x)))`` in windows or globally, then
    ``x + ls2(mlp(norm2(x)))`` (the original's modules, copied; vispe's ``Attention``)."""

    def __init__(self, norm1, attn, norm2, mlp, window_size: int, ls1=None, ls2=None, drop_path1=None,
                 drop_path2=None) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp
        self.window_size = int(window_size)
        self.swap_global_axes = False  # True: a global block's encoding sees the grid as (w, h) (SAM 3's buffer)
        self.ls1, self.ls2 = ls1 or nn.Identity(), ls2 or nn.Identity()
        self.drop_path1, self.drop_path2 = drop_path1 or nn.Identity(), drop_path2 or nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, window_padding: str = "attend"):
        from timm.models.vision_transformer_sam import window_partition, window_unpartition

        B, H, W, C = x.shape
        shortcut = x
        x = self.norm1(x)
        ws = self.window_size
        if ws > 0:
            x, pad_hw = window_partition(x, ws)  # (B * windows, ws, ws, C), zero tokens fill the last windows
            shape = (ws, ws)
            if mask is not None or (window_padding == "mask" and pad_hw != (H, W)):
                full = mask if mask is not None else torch.zeros(B, H, W, dtype=torch.bool, device=x.device)
                if window_padding == "attend":  # SAM's zero tokens stay keys: pad the mask with False
                    full = nn.functional.pad(full, (0, pad_hw[1] - W, 0, pad_hw[0] - H), value=False)
                mask = partition_mask(full, ws)  # (B * windows, ws, ws)
        elif self.swap_global_axes:  # SAM 3 in transformers: global positions of the (w, h) grid, raster order
            if mask is not None:
                raise ValueError("a padding mask with swap_global_axes=True: the swapped grid has no valid area; "
                                 "expected rope_positions 'interpolate' or 'extend' (vispe.models.towers.sam3)")
            shape = (W, H)
        else:
            shape = (H, W)
        if mask is not None and not mask.any():
            mask = None
        y = self.attn(x.reshape(x.shape[0], -1, C), ctx=PosContext(shape, 0, mask))  # (B', ws*ws or h*w, C)
        y = y.view(x.shape)
        if ws > 0:
            y = window_unpartition(y, ws, (H, W), pad_hw)  # (B, H, W, C)
        x = shortcut + self.drop_path1(self.ls1(y))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class SamTower(Tower):
    """SAM's image encoder with vispe attention and encodings (module docstring); the subclasses give
    transformers' and timm's call conventions."""

    #: "attend": SAM's zero tokens filling the last windows are keys (default); "mask": hidden as padding
    window_padding: str = "attend"

    def __init__(self, *, patch_embed: nn.Conv2d, blocks: list[SamBlock], neck: nn.Module, grid: tuple[int, int],
                 norm_pre: nn.Module | None = None, pos_drop: nn.Module | None = None) -> None:
        super().__init__()
        self.patch_embed = patch_embed
        self.blocks = nn.ModuleList(blocks)
        self.neck = neck
        self.norm_pre = norm_pre or nn.Identity()
        self.pos_drop = pos_drop or nn.Identity()
        self.pe_grid = tuple(grid)
        self.in_chans = patch_embed.in_channels
        self.patch_size = tuple(patch_embed.kernel_size)

    def native_pe(self) -> tuple[str, dict]:
        return (self._native, {})

    def _setup_pe(self, pe: str | None, pe_kwargs: dict | None, *, pe_at: str, peg_blocks) -> None:
        """``Tower._setup_pe``, then windowed blocks get rotary / bias encodings built for their window."""
        if pe_at != "input":
            raise ValueError(f"pe_at={pe_at!r}: SAM's windowed blocks take additive encodings at the input only "
                             "(expected pe_at='input')")
        super()._setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks)
        if self.pe_family in ("rotary", "bias"):
            attn = self.blocks[0].attn
            ref = next(self.parameters())
            for blk in self.blocks:
                if blk.window_size:
                    context = dict(dim=attn.qkv.in_features, num_heads=attn.num_heads, head_dim=attn.head_dim,
                                   grid=(blk.window_size, blk.window_size), num_prefix_tokens=0)
                    pe_i = build_in(self.pe_name, context, **self.pe_kwargs).to(device=ref.device, dtype=ref.dtype)
                    blk.attn.set_pe(pe_i)

    # --- the encoder ----------------------------------------------------------------------------
    def _embed(self, x: torch.Tensor, mask: torch.Tensor | None, name: str):
        _checks.choice("window_padding", self.window_padding, WINDOW_PADDING)
        _checks.images(name, x, mask, in_chans=self.in_chans, multiple_of=self.patch_size)
        x = self.patch_embed(x).permute(0, 2, 3, 1)  # (B, h, w, C)
        B, h, w, C = x.shape
        grid_mask = None if mask is None else patch_mask(mask, self.patch_size)  # (B, h, w)
        tokens, _ = self.input_code(x.reshape(B, h * w, C), (h, w), grid_mask)  # abs_pe, then an additive pe
        x = tokens.view(B, h, w, C)  # (B, h, w, C)
        return self.norm_pre(self.pos_drop(x)), grid_mask

    def _block(self, i: int, x: torch.Tensor, grid_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.blocks[i](x, grid_mask, self.window_padding)  # (B, h, w, C)
        if self.pe_family == "conditional" and i in self.peg_blocks:
            B, h, w, C = x.shape
            x = self._apply_peg(x.reshape(B, h * w, C), PosContext((h, w), 0, grid_mask)).view(B, h, w, C)
        return x

    def _neck(self, x: torch.Tensor, grid_mask: torch.Tensor | None) -> torch.Tensor:
        """The neck on (B, h, w, C) tokens; with a mask, padded cells are zeroed before each convolution.  # (B, C', h, w)"""
        x = x.permute(0, 3, 1, 2)  # (B, C, h, w)
        if grid_mask is None or not grid_mask.any():
            return self.neck(x)
        keep = (~grid_mask)[:, None].to(x.dtype)  # (B, 1, h, w)
        for layer in self.neck.children() if isinstance(self.neck, nn.Sequential) else [self.neck]:
            x = layer(x * keep if isinstance(layer, nn.Conv2d) else x)
        return x

    def encode(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, name: str = "x", states: list | None = None):
        """Pixels (B, C, H, W) [+ padding mask (B, H, W)] -> the last block's tokens (B, h, w, C) and the
        grid mask; ``states`` collects the first block's input and every block's output."""
        x, grid_mask = self._embed(x, mask, name)
        if states is not None:
            states.append(x)
        for i in range(len(self.blocks)):
            x = self._block(i, x, grid_mask)
            if states is not None:
                states.append(x)
        return x, grid_mask


class SamVisionEncoderTower(SamTower):
    """transformers' ``SamVisionEncoder`` call convention (module docstring)."""

    def forward(self, pixel_values: torch.Tensor, mask: torch.Tensor | None = None, **kwargs):
        """``pixel_values`` (B, C, H, W) -> ``SamVisionEncoderOutput`` as the original returns it."""
        from transformers.models.sam.modeling_sam import SamVisionEncoderOutput

        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        states = [] if hidden else None
        x, grid_mask = self.encode(pixel_values, mask, name="pixel_values", states=states)
        out = SamVisionEncoderOutput(last_hidden_state=self._neck(x, grid_mask),
                                     hidden_states=tuple(states) if hidden else None)
        return out if return_dict else out.to_tuple()


class SamViTTower(SamTower):
    """timm's ``VisionTransformerSAM`` call convention (module docstring)."""

    def forward_features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x, grid_mask = self.encode(x, mask)
        return self._neck(x, grid_mask)  # (B, C', h, w)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, mask: torch.Tensor | None = None):
        """timm's head on the neck's output; with a grid mask (B, h, w) holding padding, average pooling
        over the valid cells ("avg" pooling of a ``ClassifierHead`` only; others are refused)."""
        if mask is None or not mask.any():
            return self.head(x, pre_logits=True) if pre_logits else self.head(x)
        from timm.layers import ClassifierHead

        if not isinstance(self.head, ClassifierHead) or self.global_pool != "avg":
            raise ValueError(f"a padding mask with global_pool={self.global_pool!r} and a {type(self.head).__name__}: "
                             "expected global_pool='avg' with timm's ClassifierHead (pooling over valid cells)")
        keep = (~mask)[:, None].to(x.dtype)  # (B, 1, h, w)
        x = self.head.drop((x * keep).sum((2, 3)) / keep.sum((2, 3)))  # (B, C)
        return x if pre_logits else self.head.fc(x)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        feats = self.forward_features(x, mask)
        grid_mask = None if mask is None else patch_mask(mask, self.patch_size)
        return self.forward_head(feats, mask=grid_mask)

    def forward_intermediates(self, x: torch.Tensor, indices=None, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False,
                              mask: torch.Tensor | None = None):
        """timm's ``forward_intermediates``: block outputs as (B, C, h, w) (through the neck with ``norm``)."""
        from timm.models._features import feature_take_indices

        _checks.choice("output_fmt", output_fmt, ("NCHW",))
        take, max_index = feature_take_indices(len(self.blocks), indices)
        x, grid_mask = self._embed(x, mask, "x")
        outs = []
        for i in range((max_index if stop_early else len(self.blocks) - 1) + 1):
            x = self._block(i, x, grid_mask)
            if i in take:
                outs.append(self._neck(x, grid_mask) if norm else x.permute(0, 3, 1, 2))
        if intermediates_only:
            return outs
        return self._neck(x, grid_mask), outs


# --- converters ------------------------------------------------------------------------------------
def _finish(tower: SamTower, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos, *, rel_tables, pos_embed):
    """Encodings in place (module docstring): ``rel_tables`` [(rel_pos_h, rel_pos_w) or None per block],
    ``pos_embed`` (1, gh, gw, C) or None: the table is the tower's ``abs_pe``, kept, replaced or taken over
    by ``Tower.setup_pe``'s rule."""
    if keep_abs_pos is True and pe == "learned_abs":
        raise ValueError("keep_abs_pos=True with pe='learned_abs': the absolute table would be added twice")
    if pos_embed is not None:
        gh, gw, C = pos_embed.shape[1:]
        tower.abs_pe = LearnedAbsEncoding(C, grid=(gh, gw), interpolation="bicubic", antialias="always")
        tower.abs_pe.load_state_dict({"pos_embed": pos_embed.detach().reshape(1, gh * gw, C),
                                      "table_grid": torch.tensor((gh, gw))})
        tower.abs_pe.to(device=pos_embed.device, dtype=pos_embed.dtype)
    native = pe is None
    tower._native = "relpos_decomposed" if rel_tables[0] is not None else "none"
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)
    if native and rel_tables[0] is not None:
        for blk, (rh, rw) in zip(tower.blocks, rel_tables):
            n = blk.window_size or None
            grid = (n, n) if n else tower.pe_grid
            blk.attn.pe.load_state_dict({"rel_pos_h": rh.detach(), "rel_pos_w": rw.detach(),
                                         "table_grid": torch.tensor(grid)})
    return tower


@register_tower("transformers", "SamVisionEncoder")
def convert_hf_sam(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                   peg_blocks=(0,), keep_abs_pos: bool | None = None) -> SamVisionEncoderTower:
    """A ``SamVisionEncoderTower`` with the weights of transformers' ``SamVisionEncoder`` (module docstring)."""
    cfg = model.config
    blocks = []
    for layer in model.layers:
        a = layer.attn
        attn = fused_attention(a.num_attention_heads, a.qkv, a.proj)
        attn.attn_drop.p = float(a.dropout)
        blocks.append(SamBlock(copy.deepcopy(layer.layer_norm1), attn, copy.deepcopy(layer.layer_norm2),
                               copy.deepcopy(layer.mlp), layer.window_size))
    neck = nn.Sequential(*(copy.deepcopy(m) for m in (model.neck.conv1, model.neck.layer_norm1, model.neck.conv2,
                                                       model.neck.layer_norm2)))
    g = cfg.image_size // cfg.patch_size
    tower = SamVisionEncoderTower(patch_embed=copy.deepcopy(model.patch_embed.projection), blocks=blocks, neck=neck,
                                  grid=(g, g))
    tower.config = copy.deepcopy(cfg)
    rel = [(layer.attn.rel_pos_h, layer.attn.rel_pos_w) if layer.attn.use_rel_pos else None for layer in model.layers]
    _finish(tower, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos, rel_tables=rel, pos_embed=model.pos_embed)
    return tower.train(model.training)


@register_tower("timm", "VisionTransformerSAM")
def convert_timm_sam(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                     peg_blocks=(0,), keep_abs_pos: bool | None = None) -> SamViTTower:
    """A ``SamViTTower`` with the weights of timm's ``VisionTransformerSAM`` (module docstring)."""
    if model.rope_global is not None or model.rope_window is not None:
        raise ValueError("use_rope=True: timm's SAM RoPE (RotaryEmbeddingCat per window and global grid) is not "
                         "converted; name an encoding (pe=...) after converting a use_rel_pos model")
    if not isinstance(model.patch_drop, nn.Identity):
        raise ValueError("patch_drop_rate > 0: dropped patches leave no grid for windows and positions")
    pe_mod = model.patch_embed
    if not isinstance(pe_mod.norm, nn.Identity) or getattr(pe_mod, "dynamic_img_pad", False):
        raise ValueError("a patch-embedding norm or dynamic_img_pad=True: expected timm's plain PatchEmbed")
    blocks = []
    for blk in model.blocks:
        a = blk.attn
        attn = fused_attention(a.num_heads, a.qkv, a.proj)
        attn.attn_drop.p = a.attn_drop.p
        attn.proj_drop = copy.deepcopy(a.proj_drop)
        attn.q_norm, attn.k_norm = copy.deepcopy(a.q_norm), copy.deepcopy(a.k_norm)
        blocks.append(SamBlock(copy.deepcopy(blk.norm1), attn, copy.deepcopy(blk.norm2), copy.deepcopy(blk.mlp),
                               blk.window_size, copy.deepcopy(blk.ls1), copy.deepcopy(blk.ls2),
                               copy.deepcopy(blk.drop_path1), copy.deepcopy(blk.drop_path2)))
    tower = SamViTTower(patch_embed=copy.deepcopy(pe_mod.proj), blocks=blocks, neck=copy.deepcopy(model.neck),
                        grid=tuple(pe_mod.grid_size), norm_pre=copy.deepcopy(model.norm_pre),
                        pos_drop=copy.deepcopy(model.pos_drop))
    tower.head, tower.num_classes, tower.global_pool = copy.deepcopy(model.head), model.num_classes, model.global_pool
    tower.num_features, tower.embed_dim = model.num_features, model.embed_dim
    rel = [(b.attn.rel_pos_h, b.attn.rel_pos_w) if b.attn.use_rel_pos else None for b in model.blocks]
    _finish(tower, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos, rel_tables=rel, pos_embed=model.pos_embed)
    return tower.train(model.training)
