"""NaFlex (SigLIP-2's native flexible resolution, Tschannen et al., 2025, "SigLIP 2"; timm
``NaFlexVit``) in vispe: packed variable-aspect inputs for any vispe ViT, and timm's ``naflexvit_*``
converted.

NaFlex resizes each image keeping its aspect ratio to at most a patch budget, cuts it into patches
and packs them: ``patches`` (B, N, ph*pw*C) (each patch flattened as (ph, pw, C), timm's
``channels_last``), ``patch_coord`` (B, N, 2) as (y, x) patch indices and ``patch_valid`` (B, N),
False on the padding that fills each row up to N (``vispe.data.naflex`` makes them with timm's
transforms). That is a padding mask by another name: ``packed_to_images`` puts each image's
patches back on a canvas of (max h, max w) patches at their (y, x), with the pixel padding mask of
the cells no patch fills, and every vispe ViT runs it with its mask machinery (key padding in
attention, positions counted over each image's valid area by the mask-aware encodings, masked
pooling). ``forward_packed`` / ``forward_features_packed`` do that and give the outputs in the
packed order. Each image's outputs equal the image run alone wherever its encoding is invariant to
bottom/right padding (``tests/test_contract_vit.py``; ``learned_abs`` with ``mask_aware=True``,
NaFlex's own rule: its table resampled to each image's grid). Cost: the canvas (max h x max w
patches), not N; padding tokens of the packed output are zero.

``convert_naflex`` (reached through ``convert_vit``): a new ``VispeViT`` holding a NaFlexVit's
modules (blocks, norms, pooling, head, class / register tokens; its linear patch projection as the
equal convolution) with ``learned_abs(mask_aware=True, antialias="always")`` for its learned 2D
table (timm resamples it to each image's grid with antialias) or ``none``; another ``pe`` replaces
the table. Refused with the reason: RoPE, factorized tables, grid_sample or aspect-preserving
resampling, input / embedding norms, patch dropout, EVA-style blocks.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.attention import Attention
from vispe.models._vit_model import VispeBlock, VispeViT


def _unpack_args(batch, patch_coord, patch_valid):
    if isinstance(batch, dict):  # timm's NaFlexCollator output
        return batch["patches"], batch.get("patch_coord", patch_coord), batch.get("patch_valid", patch_valid)
    return batch, patch_coord, patch_valid


def packed_to_images(patches: torch.Tensor, patch_coord: torch.Tensor, patch_valid: torch.Tensor, *,
                     patch_size, in_chans: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed patches -> (images (B, C, h*ph, w*pw), pixel padding mask (B, h*ph, w*pw), True = padding).

    (h, w) = the largest valid (y + 1, x + 1) of the batch; image b's patch n lands at cell
    ``patch_coord[b, n]``; cells no valid patch fills are zero and padding.
    """
    ph, pw = _checks.grid_shape("patch_size", patch_size)
    if not isinstance(patches, torch.Tensor) or patches.dim() != 3 or patches.shape[-1] != ph * pw * in_chans:
        got = tuple(patches.shape) if isinstance(patches, torch.Tensor) else type(patches).__name__
        raise ValueError(f"patches has shape {got}: expected (B, N, {ph * pw * in_chans}) = (B, N, ph*pw*C), "
                         "each patch flattened as (ph, pw, C)")
    B, N, _ = patches.shape
    if not isinstance(patch_coord, torch.Tensor) or patch_coord.shape != (B, N, 2) or patch_coord.is_floating_point():
        got = tuple(patch_coord.shape) if isinstance(patch_coord, torch.Tensor) else type(patch_coord).__name__
        raise ValueError(f"patch_coord has shape {got}: expected an integer ({B}, {N}, 2) tensor of (y, x)")
    if not isinstance(patch_valid, torch.Tensor) or patch_valid.shape != (B, N):
        got = tuple(patch_valid.shape) if isinstance(patch_valid, torch.Tensor) else type(patch_valid).__name__
        raise ValueError(f"patch_valid has shape {got}: expected ({B}, {N}), True on real patches")
    valid = patch_valid.bool()  # (B, N)
    empty = ~valid.any(1)  # (B,)
    if empty.any():
        raise ValueError(f"patch_valid[{int(empty.nonzero()[0])}] has no valid patch: expected at least one per image")
    coord = patch_coord.long()  # (B, N, 2)
    if (coord[valid] < 0).any():
        raise ValueError("patch_coord has negative (y, x) on valid patches: expected patch indices >= 0")
    h, w = (int(v) + 1 for v in coord[valid].amax(0))
    b, n = valid.nonzero(as_tuple=True)  # (V,) each
    y, x = coord[b, n, 0], coord[b, n, 1]  # (V,) each
    cell = (b * h + y) * w + x  # (V,)
    if cell.unique().numel() != cell.numel():
        raise ValueError("patch_coord repeats a (y, x) among one image's valid patches: expected each cell once")
    grid = patches.new_zeros(B, h, w, ph, pw, in_chans)  # (B, h, w, ph, pw, C)
    grid[b, y, x] = patches[b, n].reshape(-1, ph, pw, in_chans)
    images = grid.permute(0, 5, 1, 3, 2, 4).reshape(B, in_chans, h * ph, w * pw)  # (B, C, H, W)
    cells = torch.ones(B, h, w, dtype=torch.bool, device=patches.device)  # (B, h, w)
    cells[b, y, x] = False
    mask = cells.repeat_interleave(ph, 1).repeat_interleave(pw, 2)  # (B, H, W)
    return images, mask


def _model_patch(model) -> tuple[tuple[int, int], int]:
    pe = model.patch_embed
    return tuple(pe.patch_size), pe.proj.in_channels


def forward_packed(model, batch, patch_coord: torch.Tensor | None = None,
                   patch_valid: torch.Tensor | None = None) -> torch.Tensor:
    """A vispe ViT's output (logits, or pooled features without a head) on packed inputs.  # (B, K)

    ``batch``: ``patches`` (B, N, ph*pw*C) with ``patch_coord`` and ``patch_valid``, or timm's
    NaFlex dict holding the three.
    """
    patches, patch_coord, patch_valid = _unpack_args(batch, patch_coord, patch_valid)
    ps, chans = _model_patch(model)
    images, mask = packed_to_images(patches, patch_coord, patch_valid, patch_size=ps, in_chans=chans)
    return model(images, mask)


def forward_features_packed(model, batch, patch_coord: torch.Tensor | None = None,
                            patch_valid: torch.Tensor | None = None) -> torch.Tensor:
    """A vispe ViT's final tokens in the packed order, prefix tokens first.  # (B, P + N, C)

    Token ``P + n`` of image b is its patch ``n``; padding patches (``patch_valid`` False) get zeros.
    """
    patches, patch_coord, patch_valid = _unpack_args(batch, patch_coord, patch_valid)
    ps, chans = _model_patch(model)
    images, mask = packed_to_images(patches, patch_coord, patch_valid, patch_size=ps, in_chans=chans)
    tokens = model.forward_features(images, mask)  # (B, P + h*w, C)
    P = model.num_prefix_tokens
    w = images.shape[-1] // ps[1]
    coord = patch_coord.long().clamp(min=0)  # (B, N, 2)
    index = (coord[..., 0] * w + coord[..., 1]).clamp(max=tokens.shape[1] - P - 1)  # (B, N)
    grid = tokens[:, P:].gather(1, index[..., None].expand(-1, -1, tokens.shape[-1]))  # (B, N, C)
    grid = grid * patch_valid.bool()[..., None].to(grid.dtype)  # (B, N, C)
    return torch.cat([tokens[:, :P], grid], dim=1)  # (B, P + N, C)


def _refuse(model) -> None:
    """A ValueError for every NaFlexVit setting the conversion does not reproduce."""
    e = model.embeds
    checks = [
        (model.rope is not None, "a RoPE (rope_type set): convert the classic Eva of the same weights"),
        (e.pos_embed_type not in ("learned", "none"), f"pos_embed_type={e.pos_embed_type!r}: expected 'learned' or 'none'"),
        (e.pos_embed_ar_preserving, "pos_embed_ar_preserving=True: its table is resampled to a square"),
        (e.pos_embed_align_corners, "pos_embed_align_corners=True: vispe resamples with align_corners=False"),
        (e.pos_embed_use_grid_sample, "pos_embed_use_grid_sample=True: a bilinear sample per patch, not a resampling"),
        (e.pos_embed_type == "learned" and e.pos_embed_interp_mode not in ("bicubic", "bilinear"),
         f"pos_embed_interp_mode={e.pos_embed_interp_mode!r}: expected 'bicubic' or 'bilinear'"),
        (e.norm_input is not None or not isinstance(e.norm, nn.Identity), "an input or embedding norm"),
        (model.patch_drop is not None, "patch_drop_rate > 0"),
        (getattr(e, "dynamic_img_pad", False), "dynamic_img_pad=True"),
    ]
    for bad, why in checks:
        if bad:
            raise ValueError(f"this NaFlexVit has {why}; no vispe equivalent")


def convert_naflex(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                   peg_blocks=(0,)):
    """A ``VispeViT`` with a timm ``NaFlexVit``'s modules and weights (module docstring)."""
    from timm.layers import Attention as TimmAttention
    from timm.models.vision_transformer import Block

    _refuse(model)
    e = model.embeds
    for i, blk in enumerate(model.blocks):
        if type(blk) is not Block or type(blk.attn) is not TimmAttention or blk.attn.gate is not None:
            raise ValueError(f"model.blocks[{i}] is a {type(blk).__name__}: expected timm's Block with its plain "
                             "Attention (EVA-style NaFlex blocks do not convert)")
    ph, pw = e.patch_size
    C = model.embed_dim
    in_chans = e.proj.in_features // (ph * pw) if e.is_linear else e.proj.in_channels
    table = e.pos_embed if e.pos_embed_type == "learned" else None  # (1, gh, gw, C)
    grid = (16, 16) if table is None else tuple(table.shape[1:3])
    native = pe is None
    if native:
        pe = "none" if table is None else "learned_abs"
        pe_kwargs = {} if table is None else dict(mask_aware=True, interpolation=e.pos_embed_interp_mode,
                                                  antialias="always" if e.pos_embed_antialias else False,
                                                  **(pe_kwargs or {}))
    out = VispeViT(pe=pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks,
                   img_size=(grid[0] * ph, grid[1] * pw), patch_size=(ph, pw), in_chans=in_chans,
                   num_classes=model.num_classes, global_pool=model.global_pool, embed_dim=C,
                   depth=len(model.blocks), num_heads=model.blocks[0].attn.num_heads,
                   class_token=model.has_class_token, reg_tokens=model.num_reg_tokens, no_embed_class=True,
                   fc_norm=not isinstance(model.fc_norm, nn.Identity), pool_include_prefix=model.pool_include_prefix,
                   device=e.proj.weight.device, dtype=e.proj.weight.dtype)
    for blk in model.blocks:
        blk.__class__ = VispeBlock
        Attention.adopt(blk.attn)
        blk.attn.pe = None
    out.blocks, out.norm_pre, out.norm, out.fc_norm = model.blocks, model.norm_pre, model.norm, model.fc_norm
    out.head, out.head_drop, out.attn_pool = model.head, model.head_drop, model.attn_pool
    out.cls_token, out.reg_token = e.cls_token, e.reg_token
    with torch.no_grad():
        w = e.proj.weight  # linear (C, ph*pw*in) as (ph, pw, in) or (in, ph, pw); conv (C, in, ph, pw)
        if e.is_linear:
            w = (w.reshape(C, ph, pw, in_chans).permute(0, 3, 1, 2) if e.channels_last
                 else w.reshape(C, in_chans, ph, pw))
        out.patch_embed.proj.weight.copy_(w)
        if e.proj.bias is not None:
            out.patch_embed.proj.bias.copy_(e.proj.bias)
        else:
            out.patch_embed.proj.bias.zero_()
    out.setup_pe(pe, pe_kwargs or {}, pe_at=pe_at, peg_blocks=peg_blocks)
    if native and table is not None:
        out.load_pos_embed(table.detach().reshape(1, grid[0] * grid[1], C), grid)
    return out.train(model.training)
