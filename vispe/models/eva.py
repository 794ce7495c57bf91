"""Any vispe encoding inside timm's ``Eva`` family (EVA, EVA-02, timm's RoPE ViTs from rope-vit,
PE-core...): ``convert_eva``, reached through ``convert_vit`` / ``create_vit``.

    model = convert_vit(timm.create_model("vit_small_patch16_rope_224"))          # its own RoPE
    model = convert_vit(timm.create_model("eva02_tiny_patch14_224"), pe="sine")   # another encoding

Eva's modules are kept as they are (patch embedding, blocks and their ``EvaAttention`` /
``AttentionRope``, norms, pooling, heads: same weights, same state_dict keys); only the position
encoding changes, and the token loop is vispe's (``VispeEva``). Eva's attention already takes a
RoPE table and an ``attn_mask``, so each family goes where Eva can take it:

* rotary: one encoding per layer, ``blocks[i].attn.pe``; its angles become Eva's sin/cos table in
  the attention's own pairing (``rotate_half``: "half", else "interleaved"); prefix tokens stay
  unrotated (Eva's rule and vispe's).
* bias: one encoding per layer, ``blocks[i].attn.pe``, passed as the float ``attn_mask`` (so not
  a contextual bias, which needs the queries inside the attention: refused).
* additive (at the input) and conditional (PEG after ``peg_blocks``): ``model.pe``, as in VispeViT.

Which position encoding ``pe`` replaces: ``pe=None`` keeps the model's own, mapped to vispe:
Eva's ``RotaryEmbeddingCat`` (rope-vit axial, EVA-02) -> ``rope_axial`` with its temperature,
axis order (``grid_indexing``), pairing and reference grid (``ref_feat_shape``);
``RotaryEmbeddingMixed`` -> ``rope_mixed`` with its learned frequencies (``from_rope_vit_freqs``);
``RotaryEmbeddingDinoV3`` (timm's ``vit_*_dinov3``) -> ``rope_axial`` with DINOv3's options
(``vispe.models.dinov3``: centred coordinates, periods, training augmentation);
an absolute table only (EVA) -> ``learned_abs``; Eva's absolute table next to a RoPE (EVA-02,
``*_rope_ape``) is kept and applied as Eva does. A named ``pe`` replaces every position encoding of
the model (the RoPE and the absolute table; ``learned_abs`` takes the absolute table over), unless
``keep_abs_pos=True`` keeps Eva's absolute table next to it. Other RoPE types (MRoPE) have
no vispe equivalent: name a ``pe`` for them.
"""
from __future__ import annotations

import torch
from timm.layers import resample_abs_pos_embed
from timm.models.eva import Eva

from vispe import _checks, _tracing
from vispe.attention import PosContext
from vispe.coords import resize_mask
from vispe.image.learned_abs import resample_grid_table
from vispe.image.rope_mixed import from_rope_vit_freqs
from vispe.models._timm_keys import TimmPosEmbedKeys
from vispe.models._token_loop import TokenLoop
from vispe.registry import build_in, get


def _rope_layout(attn) -> str:
    return "half" if getattr(attn, "rotate_half", False) else "interleaved"


def native_pe(model: Eva) -> tuple[str, dict]:
    """The vispe encoding and settings equal to an Eva model's own position encoding."""
    rope = model.rope
    if rope is None:
        return ("learned_abs", {}) if model.pos_embed is not None else ("none", {})
    kind = type(rope).__name__
    layout = _rope_layout(model.blocks[0].attn)
    if kind == "RotaryEmbeddingCat":
        if rope.in_pixels or rope.grid_type != "index" or rope.grid_offset:
            raise ValueError(f"the model's RoPE uses in_pixels={rope.in_pixels}, grid_type={rope.grid_type!r}, "
                             f"grid_offset={rope.grid_offset}: rope_axial reproduces index grids without offset "
                             "only; name the encoding (pe=...) to replace it")
        if getattr(rope, "aug_active", False):
            raise ValueError("the model's RoPE augments its coordinates in training (shift/jitter/rescale_coords): "
                             "no vispe equivalent; name the encoding (pe=...) to replace it")
        ref = None if rope.ref_feat_shape is None else tuple(int(v) for v in rope.ref_feat_shape)
        return "rope_axial", dict(base=float(rope.temperature), layout=layout, ref_grid=ref,
                                  axis_order="xy" if rope.grid_indexing == "xy" else "yx")
    if kind == "RotaryEmbeddingMixed":
        if getattr(rope, "aug_active", False):
            raise ValueError("the model's mixed RoPE augments its coordinates in training: no vispe equivalent")
        return "rope_mixed", dict(layout=layout, theta=float(rope.temperature))
    if kind == "RotaryEmbeddingDinoV3":
        from vispe.models.dinov3 import native_rope

        return native_rope(rope, layout)
    raise ValueError(f"the model's RoPE is a {kind}: no vispe equivalent; name the encoding (pe=...) to replace it")


def _native_name(model: Eva) -> str | None:
    try:
        return native_pe(model)[0]
    except ValueError:
        return None


class VispeEva(TokenLoop, TimmPosEmbedKeys, Eva):
    """timm's Eva with a vispe encoding (module docstring). Made by ``convert_eva``.

    Checkpoint keys: Eva's own, plus the encoding's (``blocks.i.attn.pe.*`` per layer, ``pe.*``);
    ``learned_abs`` is saved and read under timm's ``pos_embed`` (``vispe.models._timm_keys``), and
    timm's ``rope.freqs`` of a mixed RoPE is read into the layers' ``rope_mixed`` frequencies.
    Input checks are every vispe model's (``vispe._checks.images``).
    """

    #: refuse NaN / inf pixels (opt-in, as VispeViT's: costs one pass over the input per call)
    check_finite: bool = False

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "rope.freqs"
        if key in state_dict and getattr(self, "pe_name", None) == "rope_mixed":
            heads = self.blocks[0].attn.num_heads
            freqs = from_rope_vit_freqs(state_dict.pop(key), heads, getattr(self, "rope_grid_indexing", "xy"))
            for i, f in enumerate(freqs):
                state_dict[f"{prefix}blocks.{i}.attn.pe.freqs"] = f
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __prepare_scriptable__(self):
        _tracing.refuse_script("a vispe Eva")

    def setup_pe(self, pe: str | None, pe_kwargs: dict, *, pe_at: str = "input", peg_blocks=(0,),
                 keep_abs_pos: bool | None = None) -> None:
        own_rope, own_abs = self.rope, self.pos_embed
        native = pe is None
        if pe is None or pe == _native_name(self):
            pe, native_kwargs = native_pe(self)  # the checkpoint's own (user settings override)
            pe_kwargs = {**native_kwargs, **pe_kwargs}
            native = True
        family = get(pe).family
        if pe_at != "input":
            raise ValueError(f"pe_at={pe_at!r}: Eva's attention takes no additive code; expected 'input'")
        keep_abs = (native and own_rope is not None) if keep_abs_pos is None else keep_abs_pos
        if not isinstance(keep_abs, bool):
            raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: expected True, False or None")
        if pe == "learned_abs" and keep_abs:
            raise ValueError("keep_abs_pos=True with pe='learned_abs': the absolute table would be added twice")
        self.pe_name, self.pe_family, self.pe_kwargs = pe, family, dict(pe_kwargs)
        self.peg_blocks = tuple(peg_blocks)
        for i in self.peg_blocks:
            if not 0 <= i < len(self.blocks):
                raise ValueError(f"peg_blocks={peg_blocks!r}: expected block indices in [0, {len(self.blocks)})")
        if family in ("rotary", "bias", "conditional") and self.patch_drop is not None:
            raise ValueError(f"patch_drop_rate > 0 drops tokens, which {pe!r} ({family}) needs in place")
        attn = self.blocks[0].attn
        heads, head_dim = attn.num_heads, attn.head_dim
        # additive: prefix tokens get learned vectors only from an encoding that declares them
        # (learned_abs) and not with no_embed_class, the rule of VispeViT.setup_pe
        prefix = self.num_prefix_tokens
        if family == "additive" and (self.no_embed_class or not get(pe).learned_prefix):
            prefix = 0
        context = dict(dim=self.embed_dim, num_heads=heads, head_dim=head_dim,
                       grid=tuple(self.patch_embed.grid_size), num_prefix_tokens=prefix)
        if family == "rotary":
            layout = _rope_layout(attn)
            if pe_kwargs.get("layout", layout) != layout:
                raise ValueError(f"layout={pe_kwargs['layout']!r}: this Eva's attention pairs channels "
                                 f"{layout!r} (rotate_half={layout == 'half'})")
            pe_kwargs = {**pe_kwargs, "layout": layout}
        self.pe = None
        for blk in self.blocks:
            blk.attn.pe = None
        if family in ("additive", "conditional"):
            self.pe = build_in(pe, context, **pe_kwargs)
        elif family in ("rotary", "bias"):
            for blk in self.blocks:
                blk.attn.pe = build_in(pe, context, **pe_kwargs)
                if getattr(blk.attn.pe, "contextual", False):
                    raise ValueError(f"{pe!r} with contextual=True reads the queries inside the attention, "
                                     "which Eva's attention does not expose; use a non-contextual bias")
                if family == "rotary" and blk.attn.pe.num_heads > 1 and getattr(blk.attn, "num_kv_groups", 1) > 1:
                    raise ValueError(f"{pe!r} has per-head angles; this Eva uses grouped-query attention")
        elif pe_kwargs:
            raise ValueError(f"pe_kwargs={pe_kwargs!r}: the encoding {pe!r} takes no settings")
        self.rope_grid_indexing = getattr(own_rope, "grid_indexing", "xy")
        if native and pe == "rope_mixed":
            freqs = from_rope_vit_freqs(own_rope.freqs.detach(), heads, own_rope.grid_indexing)  # (depth, H, d/2, 2)
            with torch.no_grad():
                for blk, f in zip(self.blocks, freqs):
                    blk.attn.pe.freqs.copy_(f)
        if pe == "learned_abs" and own_abs is not None:
            self._load_abs_table(own_abs.detach())
        self.rope, self.rope_mixed = None, False
        self.pos_embed = own_abs if keep_abs else None

    def _load_abs_table(self, table: torch.Tensor) -> None:
        P = self.pe.num_prefix_tokens
        n = table.shape[1] - P
        grid = tuple(self.patch_embed.grid_size)
        if n != grid[0] * grid[1]:
            raise ValueError(f"pos_embed has {n} grid positions: expected {grid[0]} * {grid[1]}")
        with torch.no_grad():
            self.pe.pos_embed.copy_(resample_grid_table(table[:, P:], grid, self.pe.grid))
            if P:
                self.pe.prefix_embed.copy_(table[:, :P])

    # --- the token loop ------------------------------------------------------------------------
    def _tokens(self, x: torch.Tensor, mask: torch.Tensor | None):
        ph, pw = self.patch_embed.patch_size
        _checks.images("x", x, mask, in_chans=self.patch_embed.proj.in_channels, multiple_of=(ph, pw),
                       check_finite=self.check_finite)  # the ViT's rules
        B, _, H, W = x.shape
        h, w = H // ph, W // pw
        x = self.patch_embed(x).reshape(B, h * w, -1)  # (B, N, C), NHWC or flattened
        grid_mask = None
        if mask is not None:
            grid_mask = resize_mask(mask, (h, w))  # (B, h, w)
        prefix = [t.expand(B, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        prefix = torch.cat(prefix, dim=1) if prefix else x[:, :0]  # (B, P, C)
        if self.pe_family == "additive":
            x = x + self.pe((h, w), grid_mask, device=x.device, dtype=x.dtype)
            pre = self.pe.prefix(device=x.device, dtype=x.dtype)
            prefix = prefix if pre is None else prefix + pre
        P = 0 if self.no_embed_class else self.num_prefix_tokens
        table = None if self.pos_embed is None else resample_abs_pos_embed(
            self.pos_embed, new_size=(h, w), old_size=self.patch_embed.grid_size, num_prefix_tokens=P)
        if table is not None and self.no_embed_class:
            x = x + table
        x = torch.cat([prefix, x], dim=1)  # (B, P+N, C)
        if table is not None and not self.no_embed_class:
            x = x + table
        x = self.norm_pre(self.pos_drop(x))
        return x, PosContext((h, w), self.num_prefix_tokens, grid_mask)

    def _block_args(self, i: int, x: torch.Tensor, ctx: PosContext) -> dict:
        """Eva's ``rope`` and ``attn_mask`` arguments of block i."""
        pe = self.blocks[i].attn.pe
        rope, attn_mask = None, None
        if pe is not None and pe.family == "rotary":
            a = pe(ctx.shape, ctx.mask, device=x.device)  # (B|1, H|1, N, d/2)
            a = torch.cat([a, a], -1) if pe.layout == "half" else a.repeat_interleave(2, -1)  # (.., N, d)
            rope = torch.cat([a.sin(), a.cos()], dim=-1).to(x.dtype)  # (B|1, H|1, N, 2d)
        elif pe is not None:
            attn_mask = pe(ctx.shape, ctx.mask, device=x.device, dtype=x.dtype)  # (B|1, H, L, L)
        kpm = ctx.key_padding_mask  # (B, L) or None
        if kpm is not None:
            attn_mask = (~kpm[:, None, None, :] if attn_mask is None
                         else attn_mask.masked_fill(kpm[:, None, None, :], float("-inf")))
        return dict(rope=rope, attn_mask=attn_mask)

    def _run_block(self, i: int, x: torch.Tensor, ctx: PosContext) -> torch.Tensor:
        x = self.blocks[i](x, **self._block_args(i, x, ctx))
        if self.pe_family == "conditional" and i in self.peg_blocks:
            x = self._apply_peg(x, ctx)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, mask: torch.Tensor | None = None):
        """Eva's head; with a grid padding mask, average pooling skips padded tokens (other pools
        refuse a mask they would not honour)."""
        if mask is not None and self.attn_pool is None and self.global_pool == "avg":
            keep = (~mask).flatten(1).to(x.dtype)[..., None]  # (B, N, 1)
            x = (x[:, self.num_prefix_tokens:] * keep).sum(1) / keep.sum(1).clamp(min=1)  # (B, C)
            x = self.head_drop(self.fc_norm(x))
            return x if pre_logits else self.head(x)
        if mask is not None and (self.attn_pool is not None or self.global_pool != "token"):
            raise ValueError(f"a padding mask with global_pool={self.global_pool!r}: only 'avg' and 'token' "
                             "pooling ignore padded tokens here")
        return super().forward_head(x, pre_logits=pre_logits)


def convert_eva(model: Eva, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                peg_blocks=(0,), keep_abs_pos: bool | None = None) -> VispeEva:
    """Give a timm ``Eva`` a vispe encoding, in place (module docstring); its weights are kept."""
    if not isinstance(model, Eva):
        raise ValueError(f"model is a {type(model).__name__}: expected a timm Eva")
    for i, blk in enumerate(model.blocks):
        if not hasattr(blk, "attn") or type(blk.attn).__name__ not in ("EvaAttention", "AttentionRope"):
            raise ValueError(f"model.blocks[{i}] has a {type(getattr(blk, 'attn', None)).__name__}: expected "
                             "timm's EvaAttention or AttentionRope")
    model.__class__ = VispeEva
    model.dynamic_img_size = True
    model.patch_embed.strict_img_size = False
    model.setup_pe(pe, pe_kwargs or {}, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)
    return model

