"""EoMT (Kerssies et al., CVPR 2025, "Your ViT is Secretly an Image Segmentation Model") converted to
vispe, the whole model: transformers' ``EomtForUniversalSegmentation`` (a DINOv2-style ViT with a
learned table) and ``EomtDinov3ForUniversalSegmentation`` (DINOv3's RoPE), through ``convert_vit``.

The model: patch tokens (+ the table), a class token and register tokens in front; the last
``num_blocks`` layers take ``num_queries`` learned queries in front of those; before each of them the
queries predict masks from the normed tokens (mask head MLP . upscaled patch grid), and each query then
attends only to the patches its mask covers (mask logits resized bilinearly to the patch grid, > 0).
The final normed tokens give ``class_queries_logits`` (B, Q, K+1) and ``masks_queries_logits``
(B, Q, 2^u h, 2^u w) (``u`` upscale blocks: a 2x2 transposed conv, activation, depthwise 3x3 conv,
LayerNorm2d each).

Where position enters, and what happens at another size (the originals run at ``config.image_size``
only: EoMT's ``nn.Embedding(num_patches)`` fails at 64x96, both heads reshape to the config grid):

* EoMT: the table ``position_embeddings`` (gh*gw, C), added to the patch tokens only, is a
  ``learned_abs`` (``num_prefix_tokens=0``) over the config grid: at another grid it is resampled by
  vispe's rule (target size, bicubic, antialias when an axis shrinks; ``pe_kwargs`` change that,
  e.g. ``{"mask_aware": True}`` to resample per image to its valid area).
* EoMT-DINOv3: ``rope_axial`` with DINOv3's options (``vispe.models.dinov3.dinov3_rope_kwargs``:
  centred coordinates per axis, periods from ``rope_theta``, the config's shift / jitter / rescale in
  training, drawn per layer where transformers draws once per forward), on the patch tokens only (queries, class and register tokens are unrotated prefix
  tokens): size-free, as in transformers.
* Both: the head reshapes the patch tokens to the input's grid and resizes mask logits to it.

Any vispe encoding replaces the original's by name (``convert_vit(eomt, pe="rope_mixed")``): rotary
and bias encodings in every layer, an additive one added to the patch tokens (its learned prefix
vectors, if any, to the class and register tokens), PEG after ``peg_blocks``; ``pe="learned_abs"``
takes EoMT's table over. ``pe_at="every_block"`` and ``keep_abs_pos`` are refused (the queries join
mid-model; the table is EoMT's only encoding).

Padding mask (vispe's extension; ``mask=`` (B, H, W), True = padding): padded patches are hidden from
attention, queries never attend to them, mask-aware encodings count positions over the valid area, and
padded cells are zeroed before each depthwise conv of the upscale blocks; so an image alone and padded
in a batch give the same masks and classes on its valid area wherever the encoding is mask-aware
(``rope_axial``, ``learned_abs`` with ``mask_aware=True``).

``forward(pixel_values, mask_labels=None, class_labels=None, patch_offsets=None, *, mask=None, **kw)``
returns the original's output class (its loss too, by the original's criterion, copied, when labels are
given; ``hidden_states``: the embeddings and every layer's output, the last one normed as transformers'
``last_hidden_state``, with ``output_hidden_states``).
``output_attentions=True`` is refused (fused attention).
"""
from __future__ import annotations

import copy
import sys

import torch
import torch.nn.functional as F
from torch import nn

from vispe import _checks
from vispe.attention import PosContext
from vispe.image.learned_abs import resample_grid_table
from vispe.models._vit_inputs import patch_mask
from vispe.models.dinov3 import dinov3_rope_kwargs
from vispe.models.towers import register_tower
from vispe.models.towers._common import Tower, check_inv_freq, output_flags, vispe_attention


class EomtBlock(nn.Module):
    """EoMT's layer: ``x + dp(ls1(attn(norm1(x))))``, then ``x + dp(ls2(mlp(norm2(x))))`` (copies of the
    original's modules; vispe's ``Attention``)."""

    def __init__(self, layer, attn) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = copy.deepcopy(layer.norm1), attn, copy.deepcopy(layer.norm2)
        self.ls1, self.ls2 = copy.deepcopy(layer.layer_scale1), copy.deepcopy(layer.layer_scale2)
        self.mlp, self.drop_path = copy.deepcopy(layer.mlp), copy.deepcopy(layer.drop_path)

    def forward(self, x: torch.Tensor, ctx: PosContext, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, ctx=ctx)))  # (B, L, C)
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


class EomtTower(Tower):
    """EoMT with vispe attention and encodings (module docstring)."""

    def __init__(self, model, blocks: list[EomtBlock], embeddings_dropout: nn.Module) -> None:
        super().__init__()
        cfg = model.config
        emb = model.embeddings
        conv = emb.patch_embeddings.projection if hasattr(emb.patch_embeddings, "projection") else emb.patch_embeddings
        self.patch_embed = copy.deepcopy(conv)
        self.cls_token = copy.deepcopy(emb.cls_token)
        self.register_tokens = copy.deepcopy(emb.register_tokens)
        self.blocks = nn.ModuleList(blocks)
        self.dropout = copy.deepcopy(embeddings_dropout)
        self.layernorm, self.query = copy.deepcopy(model.layernorm), copy.deepcopy(model.query)
        self.upscale_block, self.mask_head = copy.deepcopy(model.upscale_block), copy.deepcopy(model.mask_head)
        self.class_predictor = copy.deepcopy(model.class_predictor)
        self.criterion, self.weight_dict = copy.deepcopy(model.criterion), dict(model.weight_dict)
        self.register_buffer("attn_mask_probs", model.attn_mask_probs.detach().clone())
        self.config = copy.deepcopy(cfg)
        self.num_prefix_tokens = 1 + cfg.num_register_tokens
        self.num_queries, self.num_blocks = cfg.num_queries, cfg.num_blocks
        self.pe_grid = tuple(model.grid_size)
        self.patch_size = tuple(self.patch_embed.kernel_size)
        self._output_cls = getattr(sys.modules[type(model).__module__], f"{type(model).__name__}Output")

    def native_pe(self) -> tuple[str, dict]:
        return self._native

    def _setup_pe(self, pe: str | None, pe_kwargs: dict | None, *, pe_at: str, peg_blocks) -> None:
        if pe_at != "input":
            raise ValueError(f"pe_at={pe_at!r}: EoMT's queries join the last layers, so an additive encoding goes "
                             "to the patch tokens once (expected pe_at='input')")
        super()._setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks)

    # --- the model ------------------------------------------------------------------------------
    def _embed(self, pixel_values: torch.Tensor, mask: torch.Tensor | None):
        """Pixels -> tokens (B, P + h*w, C) (class, registers, patches), the grid and its mask."""
        _checks.images("pixel_values", pixel_values, mask, in_chans=self.patch_embed.in_channels,
                       multiple_of=self.patch_size)
        x = self.patch_embed(pixel_values.to(self.patch_embed.weight.dtype))  # (B, C, h, w)
        B, C, h, w = x.shape
        grid_mask = None if mask is None else patch_mask(mask, self.patch_size)  # (B, h, w)
        if grid_mask is not None and not grid_mask.any():
            grid_mask = None
        x, _ = self.input_code(x.flatten(2).transpose(1, 2), (h, w), grid_mask)  # (B, h*w, C)
        prefix = torch.cat([self.cls_token, self.register_tokens], dim=1).expand(B, -1, -1)  # (B, P, C)
        code = self.prefix_code(x.dtype, x.device)
        if code is not None:
            prefix = prefix + code
        return self.dropout(torch.cat([prefix, x], dim=1)), (h, w), grid_mask

    def _upscale(self, x: torch.Tensor, grid_mask: torch.Tensor | None) -> torch.Tensor:
        """The upscale blocks on (B, C, h, w); padded cells zeroed before each depthwise conv.  # (B, C, 2^u h, 2^u w)"""
        for layer in self.upscale_block.block:
            x = layer.activation(layer.conv1(x))
            if grid_mask is not None:
                keep = ~grid_mask.repeat_interleave(x.shape[-2] // grid_mask.shape[-2], 1)
                keep = keep.repeat_interleave(x.shape[-1] // grid_mask.shape[-1], 2)  # (B, H', W')
                x = x * keep[:, None].to(x.dtype)
            x = layer.layernorm2d(layer.conv2(x))
        return x

    def predict(self, x: torch.Tensor, shape: tuple[int, int], grid_mask: torch.Tensor | None):
        """Mask logits (B, Q, 2^u h, 2^u w) and class logits (B, Q, K+1) from normed tokens (B, Q+P+h*w, C)."""
        Q, P = self.num_queries, self.num_prefix_tokens
        queries = x[:, :Q]  # (B, Q, C)
        grid = x[:, Q + P:].transpose(1, 2).reshape(x.shape[0], -1, *shape)  # (B, C, h, w): the input's grid
        masks = torch.einsum("bqc,bchw->bqhw", self.mask_head(queries), self._upscale(grid, grid_mask))
        return masks, self.class_predictor(queries)

    def _query_mask(self, masks: torch.Tensor, L: int, shape: tuple[int, int], layer: int) -> torch.Tensor:
        """The original's attention mask (B, 1, L, L), True = attend: query q sees patch p where its mask
        logits resized to the grid are > 0 (all patches for queries dropped with 1 - attn_mask_probs)."""
        Q, start = self.num_queries, self.num_queries + self.num_prefix_tokens
        B = masks.shape[0]
        sees = F.interpolate(masks, size=shape, mode="bilinear").view(B, Q, -1) > 0  # (B, Q, h*w)
        prob = self.attn_mask_probs[layer]
        if prob < 1:
            sees = sees | (torch.rand(B, Q, 1, device=masks.device) > prob)
        allowed = torch.ones(B, L, L, dtype=torch.bool, device=masks.device)
        allowed[:, :Q, start:] = sees
        return allowed[:, None]

    def forward(self, pixel_values: torch.Tensor, mask_labels=None, class_labels=None, patch_offsets=None, *,
                mask: torch.Tensor | None = None, **kwargs):
        """The original's call (module docstring); ``mask`` (B, H, W) True = padding."""
        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        x, shape, grid_mask = self._embed(pixel_values, mask)
        states = [x] if hidden else None
        first = len(self.blocks) - self.num_blocks
        ctx = PosContext(shape, self.num_prefix_tokens, grid_mask)
        per_layer, attn_mask = [], None
        for i, blk in enumerate(self.blocks):
            if i == first:
                x = torch.cat([self.query.weight[None].expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
                ctx = PosContext(shape, self.num_queries + self.num_prefix_tokens, grid_mask)
            if i >= first and (self.training or self.attn_mask_probs[i - first] > 0):
                masks, classes = self.predict(self.layernorm(x), shape, grid_mask)
                per_layer.append((masks, classes))
                attn_mask = self._query_mask(masks, x.shape[1], shape, i - first)
            x = blk(x, ctx, attn_mask)
            if self.pe_family == "conditional" and i in self.peg_blocks:
                x = self._apply_peg(x, ctx)
            if states is not None:
                states.append(x)
        out = self.layernorm(x)  # (B, Q+P+h*w, C)
        if states is not None and getattr(self.config, "tie_last_hidden_states", None) is not False:
            states[-1] = out  # transformers' capture_outputs puts the normed output last
        masks, classes = self.predict(out, shape, grid_mask)
        per_layer.append((masks, classes))
        loss = None
        if mask_labels is not None and class_labels is not None:
            loss = sum(self._loss(m, c, mask_labels, class_labels) for m, c in per_layer)
        result = self._output_cls(loss=loss, masks_queries_logits=masks, class_queries_logits=classes,
                                  last_hidden_state=out, hidden_states=tuple(states) if hidden else None,
                                  patch_offsets=patch_offsets)
        return result if return_dict else result.to_tuple()

    def _loss(self, masks, classes, mask_labels, class_labels) -> torch.Tensor:
        """The original's weighted loss of one layer's predictions (its criterion, copied)."""
        losses = self.criterion(masks_queries_logits=masks, class_queries_logits=classes, mask_labels=mask_labels,
                                class_labels=class_labels, auxiliary_predictions=None)
        return sum(v * next((w for k, w in self.weight_dict.items() if k in name), 1.0) for name, v in losses.items())


# --- converters ------------------------------------------------------------------------------------
def _tower(model, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos, *, out_proj: str, dropout: nn.Module,
           native: tuple[str, dict], table: torch.Tensor | None) -> EomtTower:
    if keep_abs_pos is not None:
        raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: EoMT has one position encoding (expected None)")
    if getattr(model.config, "_attn_implementation", "sdpa") not in ("sdpa", "eager", None):
        raise ValueError(f"attn_implementation={model.config._attn_implementation!r}: expected 'sdpa' or 'eager'")
    blocks = []
    for layer in model.layers:
        a = layer.attention
        attn = vispe_attention(a.num_heads, a.q_proj, a.k_proj, a.v_proj, getattr(a, out_proj))
        attn.attn_drop.p = float(a.dropout)
        blocks.append(EomtBlock(layer, attn))
    tower = EomtTower(model, blocks, dropout)
    tower._native = native
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks)
    if table is not None and (pe is None or pe == "learned_abs"):
        with torch.no_grad():  # the table over the config grid, resampled to the encoding's if it has another
            tower.pe.pos_embed.copy_(resample_grid_table(table[None].float(), tower.pe_grid, tower.pe.table_grid()))
    return tower.train(model.training)


@register_tower("transformers", "EomtForUniversalSegmentation")
def convert_eomt(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                 peg_blocks=(0,), keep_abs_pos: bool | None = None) -> EomtTower:
    """An ``EomtTower`` with the weights of transformers' ``EomtForUniversalSegmentation`` (module docstring)."""
    table = model.embeddings.position_embeddings.weight.detach()  # (gh*gw, C), raster order
    return _tower(model, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos, out_proj="out_proj",
                  dropout=model.embeddings.dropout, native=("learned_abs", {"num_prefix_tokens": 0}), table=table)


@register_tower("transformers", "EomtDinov3ForUniversalSegmentation")
def convert_eomt_dinov3(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                        peg_blocks=(0,), keep_abs_pos: bool | None = None) -> EomtTower:
    """An ``EomtTower`` with the weights of transformers' ``EomtDinov3ForUniversalSegmentation`` (module docstring)."""
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    theta = float(cfg.rope_parameters["rope_theta"])
    want = 1 / theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32)
    check_inv_freq(model.rope_embeddings, "rope_embeddings", want, head_dim, f"DINOv3's periods of base {theta}")
    native = ("rope_axial", dinov3_rope_kwargs(base=theta, shift_coords=cfg.pos_embed_shift,
                                               jitter_coords=cfg.pos_embed_jitter,
                                               rescale_coords=cfg.pos_embed_rescale))
    return _tower(model, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos, out_proj="o_proj", dropout=model.dropout,
                  native=native, table=None)
