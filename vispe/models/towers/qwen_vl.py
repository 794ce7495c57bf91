"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers (transformers' ``Qwen2VisionTransformerPretrainedModel``,
``Qwen2_5_VisionTransformerPretrainedModel``, ``Qwen3VLVisionModel``) converted to vispe: ``convert_vit(model)``.

Their position convention (``VisionRotaryEmbedding`` and the position ids of ``grid_thw``): axial
RoPE, theta 10000 (``rope_parameters["rope_theta"]``), head_dim/4 frequencies ``theta^(-4j/head_dim)``
per axis, the h angles on the first head_dim/4 channel pairs and the w angles on the next, rotate-half
pairing, integer patch indices from 0. That is vispe's ``rope_axial`` with ``base=theta`` and its
defaults (y first, ``layout="half"``, ``coords="index"``); no new option is needed.

The token order is the model's, not the encoding's. Inputs arrive packed: ``hidden_states``
(sum of t*h*w, C*T*p*p) and ``grid_thw`` (images, 3), each frame's patches in 2x2 merge-block order
(``spatial_merge_size`` m: the m x m patches of one merged token are consecutive, blocks row-major),
the h/w ids repeated for every frame, attention inside each frame only (``cu_seqlens``). Qwen2.5-VL
also permutes the merge blocks into windows of ``window_size`` pixels (``window_size / m / patch``
merge blocks a side, tiled from each frame's top-left; tokens and rotary rows permuted together),
runs window attention except in ``fullatt_block_indexes``, and returns ``last_hidden_state`` in
that window order (``pooler_output``, the merged tokens, back in merge order).

Qwen3-VL keeps Qwen2-VL's RoPE and token order (no windows) and adds a learned square table
(``pos_embed``, ``num_position_embeddings`` = n x n) resized to each image's (h, w) bilinearly with
``align_corners=True`` (``get_vision_interpolation_indices_and_weights``: source index
``i * (n - 1) / (h - 1)``, the ``linspace`` of earlier releases), no antialias, read in merge-block
order and added after the patch embedding: vispe's ``learned_abs(interpolation="bilinear",
align_corners=True, antialias=False, mask_aware=True)`` as the tower's ``abs_pe`` (``mask_aware``:
resized to each frame's own grid on the canvas, as the original does per image). Its DeepStack
mergers (``deepstack_visual_indexes``) give ``deepstack_features`` as the original.

The converted tower (``QwenVisionTower``) keeps the original's modules (patch embedding, norms,
MLPs, merger: copied) with vispe's ``Attention`` (the same ``qkv`` / ``proj`` weights), and puts each
frame on a canvas (``vispe.models.towers._common``): raster order, padding mask where a smaller
frame leaves cells empty, so every frame attends to itself only, as with ``cu_seqlens``. Windows
are index sets of each frame's tokens (``vispe.kernels.grouped.TokenGroups``: the tokens of one window
gathered, attention among them with no mask, scattered back; ``window_impl``) wherever no cell is
padding (the packed path, an equal-size batch), and an attention mask on a padded canvas (same window,
or a padding query) or with a bias encoding. The outputs are gathered
back into the original's order: the same ``BaseModelOutputWithPooling`` (``last_hidden_state``,
``pooler_output``, ``hidden_states`` with ``output_hidden_states=True``; ``return_dict=False`` a
tuple). Any other vispe encoding runs by name (``convert_vit(model, pe="rope_mixed")``).
Refused, naming the part: a rotary table that is not the config's axial one, sizes not divisible
by the merge size, precomputed ``cu_seqlens`` / ``position_ids`` / window indices, attention weights.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from vispe.attention import PosContext
from vispe.kernels.grouped import TokenGroups, windows
from vispe.models.towers import register_tower
from vispe.models.towers._common import (
    Tower,
    TowerBlock,
    check_inv_freq,
    from_canvas,
    fused_attention,
    model_output,
    output_flags,
    to_canvas,
)
from vispe.models.towers._packed import choose_path, group_frames, run_packed


def merge_block_cells(h: int, w: int, m: int, *, device=None) -> torch.Tensor:
    """Raster index ``y * w + x`` of each patch of an (h, w) frame in m x m merge-block order.  # (h*w,)"""
    cells = torch.arange(h * w, device=device).reshape(h // m, m, w // m, m)  # (h/m, m, w/m, m)
    return cells.transpose(1, 2).flatten()  # blocks row-major, each block's m*m patches row-major


def window_token_order(h: int, w: int, m: int, window: int, *, device=None) -> torch.Tensor:
    """Qwen2.5-VL's window order of one frame's tokens (merge order in, window order out): merge blocks
    sorted by window (``window`` blocks a side, tiled from the top-left, row-major), then row-major
    inside each window; each block's m*m tokens stay together.  # (h*w,) index into merge order"""
    lh, lw = h // m, w // m
    uy, ux = torch.meshgrid(torch.arange(lh, device=device), torch.arange(lw, device=device), indexing="ij")
    uy, ux = uy.flatten(), ux.flatten()  # (lh*lw,) merge blocks in merge order
    windows_w = -(-lw // window)
    key = ((uy // window) * windows_w + ux // window) * window * window + (uy % window) * window + ux % window
    blocks = torch.argsort(key)  # (lh*lw,) keys are distinct
    return (blocks[:, None] * m * m + torch.arange(m * m, device=device)).flatten()  # (h*w,)


def window_mask(shape: tuple[int, int], patches: int, mask: torch.Tensor | None, device) -> torch.Tensor:
    """SDPA mask of window attention on a canvas: True where query and key share a window of
    ``patches`` x ``patches`` cells (tiled from the top-left), or the query is padding (so that a padded
    query never has an empty row; its output is discarded).  # (S|1, 1, h*w, h*w) bool"""
    h, w = shape
    y, x = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
    win = ((y // patches) * w + x // patches).flatten()  # (h*w,)
    same = (win[:, None] == win[None, :])[None, None]  # (1, 1, L, L)
    if mask is None:
        return same
    return same | mask.reshape(mask.shape[0], 1, -1, 1)  # (S, 1, L, L)


class QwenVisionTower(Tower):
    """A Qwen2-VL / Qwen2.5-VL vision tower with vispe attention and encodings (module docstring)."""

    #: Qwen2.5-VL's window attention kernel (``vispe.kernels.grouped.GROUP_IMPLS``): "auto", "gather", "flex"
    window_impl = "auto"

    def __init__(self, original) -> None:
        super().__init__()
        cfg = original.config
        self.config = copy.deepcopy(cfg)
        kind = type(original).__name__
        self.windowed = kind == "Qwen2_5_VisionTransformerPretrainedModel"
        self.deepstack = kind == "Qwen3VLVisionModel"
        self.spatial_merge_size = int(cfg.spatial_merge_size)
        self.patch_embed = copy.deepcopy(original.patch_embed)
        self.blocks = nn.ModuleList(
            TowerBlock.copy_of(b.norm1, fused_attention(b.attn.num_heads, b.attn.qkv, b.attn.proj), b.norm2, b.mlp)
            for b in original.blocks)
        self.merger = copy.deepcopy(original.merger)
        self.theta = float(cfg.rope_parameters["rope_theta"])
        if self.deepstack:
            self.deepstack_visual_indexes = tuple(int(i) for i in cfg.deepstack_visual_indexes)
            self.deepstack_merger_list = copy.deepcopy(original.deepstack_merger_list)
            self.abs_pe = _qwen3_table(original)
            self.pe_grid = self.abs_pe.grid  # a learned pe named in its place gets the table's grid
        if self.windowed:
            self.window_size, self.patch_size = int(cfg.window_size), int(cfg.patch_size)
            self.fullatt_block_indexes = tuple(int(i) for i in cfg.fullatt_block_indexes)
            self.window_blocks = self.window_size // self.spatial_merge_size // self.patch_size
            if self.window_blocks < 1:
                raise ValueError(f"window_size={self.window_size}: smaller than one merged token "
                                 f"({self.spatial_merge_size} x {self.patch_size} px); no window to attend in")
        self.train(original.training)

    def native_pe(self) -> tuple[str, dict]:
        return "rope_axial", dict(base=self.theta)

    def _frames(self, grid_thw: torch.Tensor) -> list[tuple[int, int, int]]:
        if not isinstance(grid_thw, torch.Tensor) or grid_thw.dim() != 2 or grid_thw.shape[-1] != 3 \
                or grid_thw.is_floating_point() or grid_thw.shape[0] == 0:
            got = tuple(grid_thw.shape) if isinstance(grid_thw, torch.Tensor) else type(grid_thw).__name__
            raise ValueError(f"grid_thw has shape {got}: expected an integer (images, 3) tensor of (t, h, w)")
        thw = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
        m = self.spatial_merge_size
        for i, (t, h, w) in enumerate(thw):
            if t < 1 or h < 1 or w < 1 or h % m or w % m:
                raise ValueError(f"grid_thw[{i}]={[t, h, w]}: expected t >= 1 and h, w positive multiples of "
                                 f"spatial_merge_size={m}")
        return thw

    def _layout(self, thw, device):
        """Canvas cells of the packed tokens in input order and in output order, frames, canvas shape."""
        m, shape = self.spatial_merge_size, (max(h for _, h, _ in thw), max(w for _, _, w in thw))
        cells, order, s = [], [], 0
        for t, h, w in thw:
            raster = merge_block_cells(h, w, m, device=device)  # (h*w,)
            y, x = raster // w, raster % w
            win = window_token_order(h, w, m, self.window_blocks, device=device) if self.windowed else None
            for _ in range(t):
                frame = s * shape[0] * shape[1] + y * shape[1] + x  # (h*w,) canvas cells
                cells.append(frame)
                order.append(frame if win is None else frame[win])
                s += 1
        return torch.cat(cells), torch.cat(order), s, shape

    def forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs):
        """The original's call: packed patches (T, C*T*p*p) and ``grid_thw`` (images, 3) ->
        ``BaseModelOutputWithPooling`` as the original returns it (module docstring)."""
        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        thw = self._frames(grid_thw)
        x = self.patch_embed(hidden_states)  # (T, C) in merge order
        total = sum(t * h * w for t, h, w in thw)
        if x.shape[0] != total:
            raise ValueError(f"hidden_states has {x.shape[0]} patches: expected sum(t * h * w) = {total} from grid_thw")
        sizes = [(h, w) for t, h, w in thw for _ in range(t)]
        self.last_path = choose_path(self.path, sizes)
        if self.last_path == "packed":
            return self._forward_packed(x, thw, sizes, hidden, return_dict)
        cells, order, frames, shape = self._layout(thw, x.device)
        canvas, mask = to_canvas(x, cells, frames, shape)  # (S, h*w, C), (S, h, w) | None
        canvas, pos = self.input_code(canvas, shape, mask)
        ctx = PosContext(shape, 0, mask, pos)
        masks = self._windows(shape, mask, x.device) if self.windowed else {}
        states, deep = [], []
        canvas = self.run_blocks(canvas, ctx, masks, (lambda s: states.append(from_canvas(s, order))) if hidden else None,
                                 on_block=self._deepstack(cells, deep) if self.deepstack else None)
        last = from_canvas(canvas, order)  # (T, C), the original's output order
        pooled = self.merger(from_canvas(canvas, cells) if self.windowed else last)  # (T / m^2, out)
        if hidden:
            states[-1] = last
        return self._output(last, pooled, states if hidden else None, deep, return_dict)

    def _windows(self, shape: tuple[int, int], mask: torch.Tensor | None, device) -> dict:
        """{block: its window attention} on frames of ``shape``: index sets of the windows' tokens
        (``TokenGroups``, attention gathered per window, no mask) where no cell is padding and the encoding
        adds no logit bias; else the SDPA mask of ``window_mask``."""
        patches = self.window_blocks * self.spatial_merge_size
        if mask is None and self.pe_family != "bias":
            h, w = shape
            op: object = TokenGroups(windows(shape, patches, device=device), h * w, impl=self.window_impl)
        else:
            op = window_mask(shape, patches, mask, device)  # (S|1, 1, h*w, h*w)
        return {i: op for i in range(len(self.blocks)) if i not in self.fullatt_block_indexes}

    def _output(self, last, pooled, states, deep, return_dict: bool):
        fields = dict(last_hidden_state=last, pooler_output=pooled, hidden_states=tuple(states) if states else None)
        if not self.deepstack:
            return model_output("BaseModelOutputWithPooling", return_dict, **fields)
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        return model_output(BaseModelOutputWithDeepstackFeatures, return_dict, deepstack_features=deep, **fields)

    def _forward_packed(self, x: torch.Tensor, thw, sizes, hidden: bool, return_dict: bool):
        """The packed path (``_packed``): frames grouped by size, no canvas; same outputs as ``forward``'s."""
        m = self.spatial_merge_size
        groups, start = group_frames(sizes)
        cells, order, s = [], [], 0
        for t, h, w in thw:
            raster = merge_block_cells(h, w, m, device=x.device)  # (h*w,) raster cell of each token, merge order
            win = window_token_order(h, w, m, self.window_blocks, device=x.device) if self.windowed else None
            for _ in range(t):
                frame = start[s] + raster  # (h*w,) virtual-canvas rows
                cells.append(frame)
                order.append(frame if win is None else frame[win])
                s += 1
        cells_t, order_t = torch.cat(cells), torch.cat(order)  # (T,), (T,)
        virtual = torch.zeros_like(x).index_copy(0, cells_t, x)  # (T, C) frames grouped by size, raster
        window = (lambda shape: self._windows(shape, None, x.device)) if self.windowed else None
        out, states = run_packed(self, virtual, groups, window=window, keep_states=hidden or self.deepstack)
        last = out[order_t]  # (T, C) the original's output order
        pooled = self.merger(out[cells_t] if self.windowed else last)  # (T / m^2, out)
        deep = [merger(states[i + 1][cells_t])
                for i, merger in zip(self.deepstack_visual_indexes, self.deepstack_merger_list)] if self.deepstack else []
        hs = [st[order_t] for st in states] if hidden and states else None
        return self._output(last, pooled, hs, deep, return_dict)

    def _deepstack(self, cells: torch.Tensor, out: list):
        """``on_block(i, x)``: Qwen3-VL's DeepStack merger of block i's output (packed merge order)."""
        def on_block(i: int, x: torch.Tensor) -> None:
            if i in self.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)]
                out.append(merger(from_canvas(x, cells)))
        return on_block


def _qwen3_table(model):
    """Qwen3-VL's learned n x n table as ``learned_abs`` with its resize (module docstring)."""
    from vispe.image.learned_abs import LearnedAbsEncoding

    weight = model.pos_embed.weight.detach()  # (n*n, C)
    n = math.isqrt(weight.shape[0])
    if n * n != weight.shape[0]:
        raise ValueError(f"pos_embed has {weight.shape[0]} rows: expected a square number (n x n table)")
    mode = getattr(model, "interpolation_mode", "bilinear")
    if mode not in ("bilinear", "bicubic"):
        raise ValueError(f"interpolation_mode={mode!r}: expected 'bilinear' or 'bicubic' (learned_abs's resizes)")
    table = LearnedAbsEncoding(weight.shape[1], grid=(n, n), interpolation=mode, antialias=False, mask_aware=True,
                               align_corners=bool(getattr(model, "interpolation_align_corners", True)))
    with torch.no_grad():
        table.pos_embed.copy_(weight[None])
    return table.to(device=weight.device, dtype=weight.dtype)


def _check_rotary(model) -> None:
    """Refuse a rotary table that is not the config's axial one (rope_axial could not reproduce it)."""
    rope = model.rotary_pos_emb
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or model.blocks[0].attn.head_dim
    theta = float(cfg.rope_parameters["rope_theta"])
    want = theta ** (-torch.arange(0, head_dim // 2, 2, dtype=torch.float32) / (head_dim // 2))  # (head_dim/4,)
    check_inv_freq(rope, "rotary_pos_emb", want, head_dim,
                   f"theta^(-4j/head_dim) with rope_theta={theta:g} and head_dim={head_dim} (the config's axial RoPE)")


@register_tower("transformers", "Qwen2VisionTransformerPretrainedModel")
@register_tower("transformers", "Qwen2_5_VisionTransformerPretrainedModel")
@register_tower("transformers", "Qwen3VLVisionModel")
def convert_qwen_vl(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                    peg_blocks=(0,), keep_abs_pos: bool | None = None) -> QwenVisionTower:
    """A ``QwenVisionTower`` with the weights of a Qwen2-VL / Qwen2.5-VL vision tower (module docstring);
    ``pe=None`` keeps its RoPE (``rope_axial``, base theta), another name replaces it."""
    for blk in model.blocks:
        if getattr(blk.attn, "attention_dropout", 0.0):
            raise ValueError(f"attention_dropout={blk.attn.attention_dropout}: expected 0 (vispe copies no dropout)")
    _check_rotary(model)
    tower = QwenVisionTower(model)
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)
    return tower
