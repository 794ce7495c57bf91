"""``VispeViT``: any vispe encoding inside a timm ``VisionTransformer`` (the model class; build it
with ``vispe.models.vit.create_vit`` / ``convert_vit``, which sit above this module so that
``deit``, ``naflex`` and ``timm_models`` import the class without an import cycle).

Built on timm's own ``VisionTransformer`` through its public knobs (``pos_embed='none'``,
``attn_layer``, ``block_fn``, ``dynamic_img_size``); only the token loop is vispe's, because
each attention layer must be told where the tokens are (a ``PosContext``).

Where each family goes (one rule per family, tested):

* additive: one module ``model.pe``; added to the patch tokens at the input (``pe_at="input"``,
  ViT) or to q and k in every layer (``pe_at="every_block"``, DETR). Prefix (class, register)
  tokens get learned prefix vectors from an encoding that declares them (``learned_prefix``:
  ``learned_abs``), none with ``no_embed_class``; any other additive encoding gives them no
  position unless ``pe_kwargs={"num_prefix_tokens": P}`` asks for its own learned vectors.
* rotary: one encoding per layer (``blocks[i].attn.pe``); prefix tokens stay unrotated.
* bias: one encoding per layer; prefix rows/columns are the encoding's learned scalars.
  Each layer's rotary or bias encoding is built with ``layer`` (its index) and ``depth`` in its
  context, taken by encodings whose settings vary with depth (LookHere's layer slopes).
* conditional (PEG): ``model.pe`` applied to the grid tokens after the blocks in ``peg_blocks``
  (CPVT: after the first); prefix tokens pass through.
* none: no position at all (the model is then permutation-equivariant over patches).

Any image size divisible by the patch size runs (fixed tables recompute, learned ones resample,
relative ones resize). ``learned_abs`` keeps timm's ``pos_embed`` key, so timm checkpoints load.

Padding mask ``(B, H, W)``, True = padding (``forward(x, mask)``): a patch counts as padding when
ALL its pixels are padding, so a partly padded patch, which holds image content, stays a token,
wherever the padding is (``patch_mask``). Padded tokens are hidden from attention (key padding),
mask-aware encodings count positions over the valid area, and every ``global_pool`` ignores them:
"avg", "max", "avgmax" (over valid tokens), "token", "map" (attention pooling with the padded keys
masked); "" returns every token (select with the mask); "prr" cannot take a mask and refuses one
with padding. An image that is all padding is refused.

Input checks: ``x`` must be a (B, in_chans, H, W) tensor with H and W positive multiples of the
patch size, the mask (B, H, W) bool; each is a ValueError naming the value. ``check_finite = True``
(off by default: one pass over the input per call) also refuses NaN or inf pixels, naming the images.
"""
from __future__ import annotations

import torch
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn
from torch.utils.checkpoint import checkpoint

from vispe import _checks, _tracing
from vispe.attention import Attention, PosContext
from vispe.models._timm_keys import TimmPosEmbedKeys
from vispe.models._token_loop import TokenLoop
from vispe.models._vit_inputs import check_images, embed_patches, masked_pool, patch_mask
from vispe.models._weight_init import init_tokens, timm_weight_init
from vispe.registry import build_in, get

#: small ViTs for CIFAR-sized images, by name (timm names work too)
PRESETS = {
    "vit_pico": dict(embed_dim=64, depth=4, num_heads=4),
    "vit_nano": dict(embed_dim=96, depth=6, num_heads=3),
    "vit_cifar": dict(embed_dim=192, depth=6, num_heads=3),
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6),
}
PE_AT = ("input", "every_block")


class VispeBlock(Block):
    """timm's Block whose attention is told where the tokens are (``ctx``)."""

    def forward(self, x, attn_mask=None, is_causal=False, ctx: PosContext | None = None):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal, ctx=ctx)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class VispeViT(TokenLoop, TimmPosEmbedKeys, VisionTransformer):
    """timm VisionTransformer with a vispe encoding (see the module docstring)."""

    #: refuse NaN / inf pixels (opt-in: costs one pass over the input per call)
    check_finite: bool = False

    def __init__(self, *, pe: str = "learned_abs", pe_kwargs: dict | None = None, pe_at: str = "input",
                 peg_blocks: tuple[int, ...] = (0,), **timm_kwargs) -> None:
        for key, want in (("pos_embed", "none"), ("dynamic_img_size", True)):
            if key in timm_kwargs and timm_kwargs[key] != want:
                raise ValueError(f"{key}={timm_kwargs[key]!r}: vispe sets it to {want!r} (choose the encoding with pe=...)")
        timm_kwargs.update(pos_embed="none", dynamic_img_size=True, attn_layer=Attention, block_fn=VispeBlock)
        timm_kwargs, tokens = timm_weight_init(timm_kwargs, loads_weights=False)  # "skip" refused, "torch" added
        super().__init__(**timm_kwargs)
        if tokens:
            init_tokens(self)
        self.setup_pe(pe, pe_kwargs or {}, pe_at=pe_at, peg_blocks=peg_blocks)

    def __prepare_scriptable__(self):  # torch.jit.script: a clear error, not a TorchScript type error
        _tracing.refuse_script("a vispe ViT")

    # --- encoding set-up -------------------------------------------------------------------
    def setup_pe(self, pe: str, pe_kwargs: dict, *, pe_at: str = "input", peg_blocks=(0,)) -> None:
        family = get(pe).family
        self.pe_name, self.pe_family, self.pe_kwargs = pe, family, dict(pe_kwargs)
        self.pe_at = _checks.choice("pe_at", pe_at, PE_AT)
        if pe_at == "every_block" and family != "additive":
            raise ValueError(f"pe_at='every_block' applies to additive encodings; {pe!r} is {family}")
        self.peg_blocks = tuple(peg_blocks)
        for i in self.peg_blocks:
            if not 0 <= i < len(self.blocks):
                raise ValueError(f"peg_blocks={peg_blocks!r}: expected block indices in [0, {len(self.blocks)})")
        if family in ("rotary", "bias", "conditional") or pe_at == "every_block":
            if not isinstance(self.patch_drop, nn.Identity):
                raise ValueError(f"patch_drop_rate > 0 drops tokens, which {pe!r} ({family}) needs in place")
        grid = tuple(self.patch_embed.grid_size)
        heads = self.blocks[0].attn.num_heads
        # additive: prefix tokens get learned position vectors only from an encoding that declares
        # them (learned_abs, timm's layout), never with no_embed_class (DeiT-3, big_vision); the
        # others give prefix tokens no position, unless pe_kwargs sets num_prefix_tokens itself
        prefix = self.num_prefix_tokens
        if family == "additive" and (self.no_embed_class or not get(pe).learned_prefix):
            prefix = 0
        context = dict(dim=self.embed_dim, num_heads=heads, head_dim=self.embed_dim // heads, grid=grid,
                       num_prefix_tokens=prefix)
        self.pe = None
        for blk in self.blocks:
            blk.attn.set_pe(None)
        if family in ("additive", "conditional"):
            self.pe = build_in(pe, context, **pe_kwargs)
        elif family in ("rotary", "bias"):
            for i, blk in enumerate(self.blocks):  # per-layer settings (LookHere's layer slopes) read layer, depth
                blk.attn.set_pe(build_in(pe, {**context, "layer": i, "depth": len(self.blocks)}, **pe_kwargs))
        elif pe_kwargs:
            raise ValueError(f"pe_kwargs={pe_kwargs!r}: the encoding {pe!r} takes no settings")

    def no_weight_decay(self) -> set[str]:
        """timm's set plus every parameter of the encodings (tables, frequencies, prefix vectors)."""
        names = {n for n, _ in self.named_parameters() if n.startswith("pe.") or ".attn.pe." in n}
        return set(super().no_weight_decay()) | names

    # --- the token loop ------------------------------------------------------------------------
    def check_input(self, x: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Refuse what the model cannot run on, with a ValueError naming it (module docstring)."""
        check_images(x, mask, patch_size=tuple(self.patch_embed.patch_size),
                     in_chans=self.patch_embed.proj.in_channels, check_finite=self.check_finite)

    def _tokens(self, x: torch.Tensor, mask: torch.Tensor | None):
        """Patch-embed, add the input encoding and the prefix tokens; return tokens and context."""
        self.check_input(x, mask)
        B, _, H, W = x.shape
        ps = self.patch_embed.patch_size
        h, w = H // ps[0], W // ps[1]
        x = embed_patches(self.patch_embed, x).reshape(B, h * w, -1)  # (B, N, C)
        grid_mask = None if mask is None else patch_mask(mask, ps)  # (B, h, w)
        prefix = [t.expand(B, -1, -1) for t in self._prefix_params() if t is not None]
        prefix = torch.cat(prefix, dim=1) if prefix else x[:, :0]  # (B, P, C)
        pos = None
        if self.pe_family == "additive":
            code = self.pe((h, w), grid_mask, device=x.device, dtype=x.dtype)  # (B|1, N, C)
            pre = self.pe.prefix(device=x.device, dtype=x.dtype)  # (1, P, C) or None
            if pre is not None and pre.shape[1] != self.num_prefix_tokens:
                raise ValueError(f"the encoding has {pre.shape[1]} prefix vectors: expected {self.num_prefix_tokens}")
            if self.pe_at == "input":
                x = x + code
                prefix = prefix if pre is None else prefix + pre
            else:
                pre = pre if pre is not None else code.new_zeros(1, self.num_prefix_tokens, code.shape[-1])
                pos = torch.cat([pre.expand(code.shape[0], -1, -1), code], dim=1)  # (B|1, P+N, C)
        x = torch.cat([prefix, x], dim=1)  # (B, P+N, C)
        x = self.norm_pre(self.patch_drop(self.pos_drop(x)))
        return x, PosContext((h, w), self.num_prefix_tokens, grid_mask, pos)

    def _prefix_params(self):
        """The prefix token parameters, in sequence order (DeiT's distilled ViT adds its own)."""
        return (self.cls_token, self.reg_token)

    def _run_block(self, i: int, x: torch.Tensor, ctx: PosContext) -> torch.Tensor:
        blk = self.blocks[i]
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            x = checkpoint(blk, x, None, False, ctx, use_reentrant=False)
        else:
            x = blk(x, ctx=ctx)
        if self.pe_family == "conditional" and i in self.peg_blocks:
            x = self._apply_peg(x, ctx)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, mask: torch.Tensor | None = None) -> torch.Tensor:
        """timm's head on tokens (B, P+N, C); with a grid padding mask (B, h, w) the pooling ignores
        padded tokens ("avg", "max", "avgmax", "map"; "token" and "" need nothing; "prr" refuses)."""
        pool = self.global_pool
        if mask is None or pool in ("", "token") or not mask.any():
            return super().forward_head(x, pre_logits=pre_logits)
        x = masked_pool(x, mask, pool, num_prefix_tokens=self.num_prefix_tokens,
                        include_prefix=self.pool_include_prefix, attn_pool=self.attn_pool)  # (B, C)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)
