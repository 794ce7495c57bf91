"""SigLIP2's NaFlex vision tower (transformers' ``Siglip2VisionModel``; Tschannen et al., 2025,
"SigLIP 2") converted to vispe: ``convert_vit(model)``.

Its position convention (``Siglip2VisionEmbeddings.resize_positional_embeddings``): a learned
(n, n, C) table, n = sqrt(num_patches), resized for every image to its own (h, w) patch grid,
bilinear, ``align_corners=False``, with antialias (when growing too); image b's h*w patches come
first in its row of the packed batch, row-major, and every padded slot after them gets the first
vector of that image's resized table. In vispe that is ``learned_abs(interpolation="bilinear",
antialias="always", mask_aware=True, pad_value="first")`` on a canvas of (max h, max w) patches
with each image at the top-left (``mask_aware``: the table is resampled to each image's valid
extent, NaFlex's rule as in ``vispe.models.naflex``).

Inputs are SigLIP2's packed ones: ``pixel_values`` (B, L, C*p*p) (each patch flattened as (p, p, C),
its processor's layout), ``pixel_attention_mask`` (B, L), 1 on the first h*w slots, and
``spatial_shapes`` (B, 2) as (h, w). The converted tower (``Siglip2VisionTower``) keeps the
original's modules (patch projection, norms, MLPs, post-norm, attention-pooling head: copied; the
original is left untouched) with vispe's ``Attention`` (q, k, v fused into ``qkv``), and returns the
same ``BaseModelOutputWithPooling`` (``last_hidden_state`` (B, L, C), ``pooler_output``, with
``output_hidden_states`` the input of the first layer and every layer's output; ``return_dict=False``
a tuple). Two runs, by encoding family:

* additive (the native table, or any additive encoding by name) and none: the tokens stay in the
  packed order; the code is computed on the canvas with its padding mask and read at each slot's
  cell, padded slots at their image's first cell (SigLIP2's rule for any encoding; the native
  table's ``pad_value="first"`` gives the canvas's padding cells the same vector), padded keys are
  hidden. Every slot, padded ones included, equals the original's.
* rotary, bias and conditional encodings (``convert_vit(model, pe="rope_axial")``) need each image's
  grid in attention: the valid tokens are put on the canvas (``vispe.models.towers._common``), run
  with its padding mask (mask-aware encodings count positions over each image's valid area, so an
  image packed with others gives what it gives alone) and gathered back; padded slots are then zero.

Which path runs (``tower.path``, ``_packed``): the two runs above are the "canvas" path. The "packed"
path takes each image's valid tokens only, groups the images by (h, w) and runs each group without
padding (each image on its own grid, no mask: what the image gives alone), then puts the tokens back
in their slots; padded slots are zero there (the original gives them outputs of their own, which its
pooling head ignores), so it costs the valid patches, not B * L. ``path="auto"`` (the default) takes
it for mixed sizes where the canvas path zeroes padded slots too (rotary, bias, conditional
encodings), and keeps the canvas path for the native table (every slot as the original);
``path="packed"`` forces it (``last_hidden_state`` equal on every valid slot, ``pooler_output`` equal).

Refused, naming the part: a ``pixel_attention_mask`` that does not mark the first h*w slots of each
row, an image larger than L slots, attention weights (fused attention), hidden states by index.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vispe.attention import PosContext
from vispe.image.learned_abs import LearnedAbsEncoding
from vispe.models.towers import register_tower
from vispe.models.towers._common import (
    Tower,
    TowerBlock,
    from_canvas,
    model_output,
    output_flags,
    to_canvas,
    vispe_attention,
)
from vispe.models.towers._packed import choose_path, group_frames, run_packed

NATIVE = dict(interpolation="bilinear", antialias="always", mask_aware=True, pad_value="first")


def siglip_blocks(layers) -> nn.ModuleList:
    """``TowerBlock``s with copies of SigLIP-style encoder layers (``layer_norm1``, ``self_attn`` with q/k/v/out
    projections, ``layer_norm2``, ``mlp``; SigLIP2's and Idefics3's), vispe's ``Attention`` with q, k, v fused."""
    blocks = nn.ModuleList()
    for layer in layers:
        a = layer.self_attn
        attn = vispe_attention(a.num_heads, a.q_proj, a.k_proj, a.v_proj, a.out_proj)
        attn.attn_drop.p = float(a.dropout)
        blocks.append(TowerBlock.copy_of(layer.layer_norm1, attn, layer.layer_norm2, layer.mlp))
    return blocks


class Siglip2VisionTower(Tower):
    """SigLIP2's vision tower with vispe attention and encodings (module docstring)."""

    def __init__(self, original) -> None:
        super().__init__()
        cfg = original.config
        self.config = copy.deepcopy(cfg)
        emb = original.embeddings
        self.patch_size, self.in_chans = int(cfg.patch_size), int(cfg.num_channels)
        self.patch_embedding = copy.deepcopy(emb.patch_embedding)  # Linear (C*p*p -> D) on (p, p, C) patches
        n = int(emb.position_embedding_size)
        self.pe_grid = (n, n)
        self.blocks = siglip_blocks(original.encoder.layers)
        self.post_layernorm = copy.deepcopy(original.post_layernorm)
        self.head = copy.deepcopy(original.head) if original.use_head else None
        self.train(original.training)

    def native_pe(self) -> tuple[str, dict]:
        return "learned_abs", dict(NATIVE)

    def _layout(self, pixel_values, pixel_attention_mask, spatial_shapes):
        """Checked inputs -> per-image (h, w), canvas shape, the canvas cell of every slot (B, L) and the
        slots' validity (B, L)."""
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 3 \
                or pixel_values.shape[-1] != self.in_chans * self.patch_size ** 2:
            got = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else type(pixel_values).__name__
            raise ValueError(f"pixel_values has shape {got}: expected (B, L, {self.in_chans * self.patch_size ** 2}) "
                             "packed patches, each flattened as (p, p, C)")
        B, L, _ = pixel_values.shape
        if not isinstance(spatial_shapes, torch.Tensor) or tuple(spatial_shapes.shape) != (B, 2) \
                or spatial_shapes.is_floating_point():
            got = tuple(spatial_shapes.shape) if isinstance(spatial_shapes, torch.Tensor) else type(spatial_shapes).__name__
            raise ValueError(f"spatial_shapes has shape {got}: expected an integer ({B}, 2) tensor of (h, w)")
        hw = [tuple(int(v) for v in row) for row in spatial_shapes.tolist()]
        for b, (h, w) in enumerate(hw):
            if h < 1 or w < 1 or h * w > L:
                raise ValueError(f"spatial_shapes[{b}]={[h, w]}: expected h, w >= 1 and h * w <= {L} slots")
        slot = torch.arange(L, device=pixel_values.device)  # (L,)
        count = torch.tensor([h * w for h, w in hw], device=slot.device)  # (B,)
        valid = slot[None] < count[:, None]  # (B, L) SigLIP2's layout: the image first, then padding
        if not isinstance(pixel_attention_mask, torch.Tensor) or tuple(pixel_attention_mask.shape) != (B, L) \
                or not torch.equal(pixel_attention_mask.bool(), valid):
            got = tuple(pixel_attention_mask.shape) if isinstance(pixel_attention_mask, torch.Tensor) else \
                type(pixel_attention_mask).__name__
            raise ValueError(f"pixel_attention_mask (shape {got}) does not mark the first h*w slots of each row "
                             f"(spatial_shapes): expected a ({B}, {L}) mask, 1 on each image's patches, 0 after them")
        shape = (max(h for h, _ in hw), max(w for _, w in hw))
        width = torch.tensor([w for _, w in hw], device=slot.device)[:, None]  # (B, 1)
        cell = torch.where(valid, (slot[None] // width) * shape[1] + slot[None] % width, 0)  # (B, L), padded: 0
        mask = torch.ones(B, *shape, dtype=torch.bool, device=slot.device)  # (B, H, W) canvas padding
        for b, (h, w) in enumerate(hw):
            mask[b, :h, :w] = False
        return shape, cell, valid, mask

    def _choose_path(self, spatial_shapes: torch.Tensor) -> str:
        """``path`` for this batch: "auto" is the packed path where it gives what the canvas path gives
        (mixed sizes, an encoding whose canvas run zeroes padded slots), the canvas path otherwise."""
        sizes = [tuple(int(v) for v in row) for row in spatial_shapes.tolist()]
        if self.path == "auto" and self.pe_family in ("additive", "none"):
            return choose_path("canvas", sizes)  # padded slots keep the original's outputs
        return choose_path(self.path, sizes)

    def forward(self, pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor, spatial_shapes: torch.Tensor,
                **kwargs):
        """The original's call -> ``BaseModelOutputWithPooling`` as the original returns it (module docstring)."""
        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        shape, cell, valid, mask = self._layout(pixel_values, pixel_attention_mask, spatial_shapes)
        x = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))  # (B, L, D)
        B, L, D = x.shape
        self.last_path = self._choose_path(spatial_shapes)
        states = [] if hidden else None
        if self.last_path == "packed":  # valid tokens only, frames grouped by size
            sizes = [tuple(int(v) for v in row) for row in spatial_shapes.tolist()]
            groups, start = group_frames(sizes)
            src = torch.empty(sum(h * w for h, w in sizes), dtype=torch.long, device=x.device)  # (T,) virtual row -> slot
            for b, (h, w) in enumerate(sizes):
                src[start[b]:start[b] + h * w] = b * L + torch.arange(h * w, device=x.device)
            out, seen = run_packed(self, x.reshape(B * L, D)[src], groups, keep_states=hidden)  # (T, D)
            back = lambda v: x.new_zeros(B * L, D).index_copy(0, src, v).view(B, L, D)  # noqa: E731  padded: 0
            states = [back(v) for v in seen] if hidden and seen else None
            x = back(out)
        elif self.pe_family in ("additive", "none"):  # packed order, every slot as the original
            pos = None
            if self.pe_family == "additive":
                code = self.pe(shape, mask, device=x.device, dtype=x.dtype)  # (B|1, H*W, D)
                code = code.expand(B, -1, -1).gather(1, cell[..., None].expand(-1, -1, D))  # (B, L, D)
                x, pos = (x + code, None) if self.pe_at == "input" else (x, code)
            ctx = PosContext((1, L), 0, ~valid[:, None, :], pos)
            x = self.run_blocks(x, ctx, on_state=states.append if hidden else None)  # (B, L, D)
        else:  # the valid tokens on the canvas, each image on its own grid
            flat = (torch.arange(B, device=x.device)[:, None] * shape[0] * shape[1] + cell)[valid]  # (T,)
            canvas, cmask = to_canvas(x[valid], flat, B, shape)  # (B, H*W, D)
            ctx = PosContext(shape, 0, cmask)
            back = lambda c: x.new_zeros(B, L, D).masked_scatter(valid[..., None], from_canvas(c, flat))  # noqa: E731
            canvas = self.run_blocks(canvas, ctx, on_state=(lambda c: states.append(back(c))) if hidden else None)
            x = back(canvas)  # (B, L, D), padded slots 0
        last = self.post_layernorm(x)  # (B, L, D)
        if self.pe_family not in ("additive", "none") or self.last_path == "packed":
            last = last * valid[..., None].to(last.dtype)
        pooled = self.head(last, pixel_attention_mask) if self.head is not None else None
        return model_output("BaseModelOutputWithPooling", return_dict, last_hidden_state=last, pooler_output=pooled,
                            hidden_states=tuple(states) if hidden else None)


@register_tower("transformers", "Siglip2VisionModel")
def convert_siglip2(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                    peg_blocks=(0,), keep_abs_pos: bool | None = None) -> Siglip2VisionTower:
    """A ``Siglip2VisionTower`` with the weights of transformers' ``Siglip2VisionModel`` (module docstring);
    ``pe=None`` keeps its table (``learned_abs`` with SigLIP2's options), another name replaces it."""
    if keep_abs_pos is not None:
        raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: SigLIP2 has one position encoding, its learned table "
                         "(pe=None keeps it, pe='learned_abs' takes it over)")
    tower = Siglip2VisionTower(model)
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks)
    if tower.pe_name == "learned_abs":  # the native table, or a named learned_abs that takes it over
        n = tower.pe_grid
        table = model.embeddings.position_embedding.weight.detach()  # (n*n, D) as (h, w) row-major
        tower.pe.load_state_dict({"pos_embed": table[None], "table_grid": torch.tensor(n)})
        if isinstance(tower.pe, LearnedAbsEncoding) and tower.pe.num_prefix_tokens:
            raise ValueError("pe_kwargs num_prefix_tokens: SigLIP2 has no prefix tokens")
    return tower
