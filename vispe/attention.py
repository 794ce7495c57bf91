"""One multi-head self-attention that takes any vispe encoding, on torch's fused SDPA.

``Attention`` subclasses timm's ``Attention`` (same parameters, same state_dict keys, so timm
checkpoints load) and adds, per call, a ``PosContext`` that says where the tokens are:

* additive at every layer (DETR style): ``ctx.pos`` (B|1, L, C) is added to the inputs of q and k
  (not v); by linearity this is ``q += pos @ W_q^T`` and ``k += pos @ W_k^T``;
* rotary: the layer's own ``pe`` (a RotaryEncoding) gives angles for the grid tokens; prefix tokens
  get angle 0 (unrotated); q and k are rotated in float32 and cast back;
* bias: the layer's own ``pe`` (a BiasEncoding) gives (B|1, heads, L, L) logits bias, passed to
  ``scaled_dot_product_attention`` as a float ``attn_mask`` (this leaves the flash kernel: torch
  then uses the memory-efficient or math kernel);
* key padding: ``ctx.key_padding_mask`` (B, L), True = padding, masks keys of padded tokens.

Tokens are ``[prefix (P), grid (h*w, row-major)]``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import Attention as TimmAttention

from vispe import _checks
from vispe.axis.rope import apply_rope
from vispe.encoding import BiasEncoding, PositionEncoding, RotaryEncoding


@dataclass
class PosContext:
    """Where the tokens of one forward pass are; built once per forward by the model."""

    shape: tuple[int, int]  # token grid (h, w)
    num_prefix_tokens: int = 0
    mask: torch.Tensor | None = None  # (B, h, w) True = padding
    pos: torch.Tensor | None = None  # (B|1, P + h*w, C) additive code for q/k (DETR style)

    @property
    def key_padding_mask(self) -> torch.Tensor | None:  # (B, P + h*w) True = padding
        if self.mask is None:
            return None
        B = self.mask.shape[0]
        kpm = self.mask.reshape(B, -1)
        if self.num_prefix_tokens:
            kpm = torch.cat([kpm.new_zeros(B, self.num_prefix_tokens), kpm], dim=1)
        # A fully padded sequence would give NaN (softmax over no key): let it attend everywhere;
        # its outputs are padding and are ignored downstream.
        return kpm & ~kpm.all(dim=1, keepdim=True)


class Attention(TimmAttention):
    """timm's Attention plus an optional rotary or bias encoding ``pe`` and a ``PosContext``.

    Takes timm's constructor arguments (so it can be timm's ``attn_layer``) and ``pe``.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, pe: PositionEncoding | None = None, **kwargs) -> None:
        _checks.positive_int("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim={dim}: expected a multiple of num_heads={num_heads}")
        if kwargs.get("gated"):
            raise ValueError("gated=True: vispe's Attention does not implement timm's output gate")
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.pe = None
        self.set_pe(pe)

    def set_pe(self, pe: PositionEncoding | None) -> None:
        """Attach a rotary or bias encoding to this layer (None to remove)."""
        if pe is not None and pe.family not in ("rotary", "bias"):
            raise ValueError(f"pe family={pe.family!r}: an attention layer takes a 'rotary' or 'bias' "
                             "encoding; additive ones go in PosContext.pos, conditional ones in the model")
        if isinstance(pe, RotaryEncoding) and (pe.head_dim != self.head_dim or pe.num_heads not in (1, self.num_heads)):
            raise ValueError(f"pe has head_dim={pe.head_dim}, num_heads={pe.num_heads}: expected "
                             f"head_dim={self.head_dim} and num_heads in (1, {self.num_heads})")
        if isinstance(pe, BiasEncoding) and pe.num_heads != self.num_heads:
            raise ValueError(f"pe has num_heads={pe.num_heads}: expected {self.num_heads}")
        self.pe = pe

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                ctx: PosContext | None = None) -> torch.Tensor:
        B, L, C = x.shape
        q, k, v = self._qkv(x, ctx)  # (B, heads, L, head_dim) each
        q, k = self.q_norm(q), self.k_norm(k)
        mask = attn_mask
        if self.pe is not None:
            if ctx is None:
                raise ValueError(f"this layer has a {self.pe.family} encoding: expected a PosContext "
                                 "(ctx=...) giving the token grid")
            if self.pe.family == "rotary":
                q, k = self._rotate(q, k, ctx)
            else:
                bias = self._bias(q, ctx)  # (B|1, heads, L, L)
                mask = bias if mask is None else mask + bias
        kpm = ctx.key_padding_mask if ctx is not None else None
        if kpm is not None:
            if mask is None:
                mask = ~kpm[:, None, None, :]  # (B, 1, 1, L) True = attend
            else:
                mask = mask.masked_fill(kpm[:, None, None, :], float("-inf"))
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(q.dtype)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                           dropout_p=self.attn_drop.p if self.training else 0.0)  # (B, heads, L, hd)
        x = x.transpose(1, 2).reshape(B, L, self.attn_dim)  # (B, L, heads*hd)
        x = self.norm(x)
        x = self.proj(x)
        return self.proj_drop(x)

    def _qkv(self, x: torch.Tensor, ctx: PosContext | None):
        B, L, _ = x.shape
        qkv = self.qkv(x)  # (B, L, 3*A)
        if ctx is not None and ctx.pos is not None:
            if ctx.pos.shape[-2:] != (L, x.shape[-1]):
                raise ValueError(f"ctx.pos has shape {tuple(ctx.pos.shape)}: expected (B|1, {L}, {x.shape[-1]})")
            w_qk = self.qkv.weight[: 2 * self.attn_dim]  # (2A, C)
            pos_qk = F.linear(ctx.pos.to(x.dtype), w_qk)  # (B|1, L, 2A)
            qkv = qkv + F.pad(pos_qk, (0, self.attn_dim))
        qkv = qkv.reshape(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)

    def _rotate(self, q: torch.Tensor, k: torch.Tensor, ctx: PosContext):
        angles = self.pe(ctx.shape, ctx.mask, device=q.device)  # (B|1, heads|1, N, hd/2) float32
        if ctx.num_prefix_tokens:
            angles = F.pad(angles, (0, 0, ctx.num_prefix_tokens, 0))  # prefix tokens: angle 0
        if angles.shape[-2] != q.shape[-2]:
            raise ValueError(f"the encoding gives {angles.shape[-2]} token angles: expected {q.shape[-2]} "
                             f"(grid {ctx.shape} + {ctx.num_prefix_tokens} prefix tokens)")
        layout = self.pe.layout
        return apply_rope(q, angles, layout), apply_rope(k, angles, layout)

    def _bias(self, q: torch.Tensor, ctx: PosContext) -> torch.Tensor:
        kw = {"q": q} if self.pe.contextual else {}
        bias = self.pe(ctx.shape, ctx.mask, device=q.device, dtype=q.dtype, **kw)  # (B|1, heads, L, L)
        L = q.shape[-2]
        if bias.shape[-2:] != (L, L):
            raise ValueError(f"the bias has shape {tuple(bias.shape)}: expected (..., {L}, {L}) "
                             f"(grid {ctx.shape} + {ctx.num_prefix_tokens} prefix tokens)")
        return bias

