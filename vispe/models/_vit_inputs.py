"""What a vispe ViT does with its input and padding mask (private to ``vispe.models.vit``).

* ``check_images``: a ValueError naming the argument, the value and what was expected for
  anything the model cannot run on (not a 4-D float tensor, an empty image, wrong channels, a size
  that is not a multiple of the patch size, a mask of another shape or batch, an image that is all
  padding) and, when asked (``check_finite``), NaN or inf pixels: ``vispe._checks.images``, the
  rules DETR shares.
* ``patch_mask``: the rule from pixels to patches: a patch is padding when ALL its pixels are.
* ``masked_pool``: timm's global pooling over the valid tokens only.
* ``embed_patches``: timm's ``PatchEmbed`` without its size assertion, which ``check_images`` has
  already made: the assertion's message is an f-string of H and W, and formatting a symbolic size
  makes torch.compile specialise it, so every new image size recompiled (issue 41).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Format, PatchEmbed, nchw_to

from vispe import _checks, _tracing

MASKED_POOLS = ("avg", "max", "avgmax", "map")


def check_images(x, mask, *, patch_size: tuple[int, int], in_chans: int, check_finite: bool = False) -> None:
    """Refuse images ``x`` (B, C, H, W) and padding mask (B, H, W) a ViT cannot run on (the rules
    every vispe model shares: ``vispe._checks.images``)."""
    _checks.images("x", x, mask, in_chans=in_chans, multiple_of=patch_size, check_finite=check_finite)


def embed_patches(patch_embed, x: torch.Tensor) -> torch.Tensor:
    """``patch_embed(x)`` for images ``x`` (B, C, H, W) that ``check_images`` accepted.  # (B, N, C) or NHWC

    timm's ``PatchEmbed.forward`` checks that H and W are multiples of the patch size with a message
    that formats H and W; under torch.compile that formatting turns the symbolic H and W into
    constants (a recompile at every new size, also with ``dynamic=True``). The check is made outside,
    by ``check_images`` (which formats sizes only when it fails), so here timm's module runs its
    projection, flattening and norm alone. Any other patch embedding (or timm's with
    ``dynamic_img_pad``) is called as it is.
    """
    if type(patch_embed) is not PatchEmbed or patch_embed.dynamic_img_pad:
        return patch_embed(x)
    proj = patch_embed.proj
    if _compiling() and _is_patchify(proj):  # torch.compile: the same numbers as a matrix product
        x = _patchify_linear(proj, x)  # (B, h, w, C)
        if patch_embed.flatten:
            x = x.flatten(1, 2)  # (B, h*w, C)
        elif patch_embed.output_fmt == Format.NCHW:
            x = x.permute(0, 3, 1, 2)  # (B, C, h, w)
        elif patch_embed.output_fmt != Format.NHWC:
            x = nchw_to(x.permute(0, 3, 1, 2), patch_embed.output_fmt)
        return patch_embed.norm(x)
    x = proj(x)  # (B, C, h, w)
    if patch_embed.flatten:
        x = x.flatten(2).transpose(1, 2)  # (B, h*w, C)
    elif patch_embed.output_fmt != Format.NCHW:
        x = nchw_to(x, patch_embed.output_fmt)
    return patch_embed.norm(x)


def _compiling() -> bool:
    """torch.compile records (not torch.export, whose graph keeps the convolution)."""
    return torch.compiler.is_compiling() and not _tracing.is_exporting()


def _is_patchify(proj) -> bool:
    """A Conv2d whose kernel equals its stride (no padding, dilation or groups): each output cell
    is a linear map of one patch."""
    return (isinstance(proj, torch.nn.Conv2d) and tuple(proj.kernel_size) == tuple(proj.stride)
            and tuple(proj.padding) == (0, 0) and tuple(proj.dilation) == (1, 1) and proj.groups == 1
            and proj.padding_mode == "zeros")


def _patchify_linear(proj, x: torch.Tensor) -> torch.Tensor:
    """``proj(x)`` of a patchifying Conv2d as patches times the flattened kernel.  # (B, h, w, C)

    Under torch.compile a convolution's backward lets the CPU backend choose its kernel by size,
    which bounds H and W in the guards (a recompile once an image is larger than any seen); a matrix
    product has no such choice. The sum over (C, ph, pw) is the convolution's, in another order
    (float rounding apart, the same numbers)."""
    B, C, H, W = x.shape
    ph, pw = proj.kernel_size
    h, w = H // ph, W // pw
    patches = x.reshape(B, C, h, ph, w, pw).permute(0, 2, 4, 1, 3, 5).reshape(B, h, w, C * ph * pw)
    return F.linear(patches, proj.weight.reshape(proj.out_channels, -1), proj.bias)  # (B, h, w, C)


def patch_mask(mask: torch.Tensor, patch_size) -> torch.Tensor:
    """Pixel padding mask (B, H, W) -> patch mask (B, H/ph, W/pw): padding where every pixel is.

    A partly padded patch holds image content and stays a token, at any side of the image.
    """
    B, H, W = mask.shape
    ph, pw = patch_size
    return mask.view(B, H // ph, ph, W // pw, pw).all(dim=4).all(dim=2)  # (B, h, w)


def masked_pool(x: torch.Tensor, mask: torch.Tensor, pool: str, *, num_prefix_tokens: int,
                include_prefix: bool = False, attn_pool=None) -> torch.Tensor:
    """timm's ``global_pool`` of tokens x (B, P+N, C) over valid tokens only.  # (B, C)

    ``mask`` (B, h, w) True = padding (prefix tokens are valid); ``include_prefix`` as timm's
    ``pool_include_prefix``; "map" runs timm's attention pooling ``attn_pool`` with padded keys
    masked. Another ``pool`` is refused (timm's "prr" takes no mask).
    """
    if pool not in MASKED_POOLS:
        raise ValueError(f"global_pool={pool!r} cannot ignore padded tokens: expected no padding in the mask, "
                         "or a model with global_pool 'avg', 'max', 'avgmax', 'token' or 'map'")
    P = num_prefix_tokens
    keep = torch.cat([mask.new_ones(mask.shape[0], P), ~mask.flatten(1)], dim=1)  # (B, P+N) True = valid
    if not include_prefix:
        x, keep = x[:, P:], keep[:, P:]  # (B, N, C), (B, N)
    if pool == "map":
        attn_mask = keep[:, None, None, :]  # (B, 1, 1, L) True = attend
        if not attn_pool.fused_attn:  # timm adds the mask to the logits there
            attn_mask = torch.zeros(attn_mask.shape, device=x.device).masked_fill(~attn_mask, float("-inf"))
        return attn_pool(x, attn_mask=attn_mask)  # (B, C)
    k = keep[..., None].to(x.dtype)  # (B, L, 1)
    avg = (x * k).sum(1) / k.sum(1)  # (B, C); every image has a valid token (check_images)
    if pool == "avg":
        return avg
    top = x.masked_fill(~keep[..., None], float("-inf")).amax(1)  # (B, C)
    return top if pool == "max" else 0.5 * (top + avg)
