"""One multi-head attention that takes any vispe encoding, on torch's fused SDPA.

``Attention`` subclasses timm's ``Attention`` (same parameters, same state_dict keys, so timm
checkpoints load) and adds, per call, a ``PosContext`` that says where the tokens are:

* additive at every layer (DETR style): ``ctx.pos`` (B|1, L, C) is added to the inputs of q and k
  (not v): ``q, k = W_qk (x + pos)``, ``v = W_v x``, as DETR and transformers' DETR compute it;
* rotary: the layer's own ``pe`` (a RotaryEncoding) gives angles for the grid tokens; prefix tokens
  get angle 0 (unrotated); q and k are rotated together in float32 and cast back
  (``vispe.kernels.rope``: cos/sin built once per grid, ``rope_impl`` "auto" | "fused" |
  "compiled" | "reference");
* bias: the layer's own ``pe`` (a BiasEncoding) gives a (B|1, heads, L, L) logits bias, added to
  the scores by ``vispe.kernels.bias_attention.attend`` (``bias_impl`` "auto" | "reference" |
  "chunked" | "flex": a learned bias keeps SDPA's fused kernel on the CPU, see there);
* key padding: ``ctx.key_padding_mask`` (B, L), True = padding, masks keys of padded tokens;
* groups: ``attn_mask`` may be a ``vispe.kernels.grouped.TokenGroups`` (index sets, e.g. the windows of a
  frame): each token attends within its group, gathered, with no mask (no bias or padding with it);
* packed: ``ctx.segments`` (``Segment``s: frames of several grids one after another in one sequence
  x (1, T, C), the converted towers' packed path): q, k, v are projected once over all T tokens, and
  only attention is split: per segment a view (frames, heads, P + h*w, hd), the encoding on the
  segment's own grid (``seg.ctx``: ``rope.rotate_qk`` / the bias per segment), ``attn_mask[i]`` (None,
  a mask or a ``TokenGroups`` of one frame's windows) and SDPA, then one ``cat``; ``ctx.pos`` (1, T, C).

Cross-attention (DETR's decoder): ``attn(x, ctx=query_ctx, memory=m, memory_ctx=memory_ctx)``
takes q from ``x`` (B, Lq, C) and k, v from ``memory`` (B, Lk, C) with the same fused weights
(``qkv`` rows q, k, v, as ``nn.MultiheadAttention``'s ``in_proj_weight``). Query and key positions
are apart: ``ctx.pos`` (B|1, Lq, C) is added to the query input, ``memory_ctx.pos`` (B|1, Lk, C)
to the key input, and ``memory_ctx``'s padding mask hides padded keys. Rotary and bias encodings
need both sides on one grid, so a layer with ``pe`` refuses cross-attention.

Positioned queries (Conditional DETR, DAB-DETR, ``vispe.models.detr.queries.positioned``) use three more
per-call inputs, each optional, on the same layer:

* decoupled projections (``q_pos=True`` / ``k_pos=True``): ``q = W_q x + P_q pos`` and
  ``k = W_k x + P_k pos`` with projections of their own (Conditional DETR's ``q_pos_proj`` /
  ``k_pos_proj``) instead of DETR's shared ``W (x + pos)``;
* a spatial part (``spatial=True``): ``ctx.spatial`` (B|1, Lq, C) through ``q_spatial`` and
  ``memory_ctx.spatial`` (B|1, Lk, C) through ``k_pos`` are appended per head to q and k, so each
  head's logit is ``(q_h.k_h + s_q,h.s_k,h) / sqrt(2 head_dim)`` (Conditional DETR's concatenation);
* a rotary ``pe`` in cross-attention: keys are rotated at their grid cells (``memory_ctx.shape``,
  mask-aware), queries at ``ctx.coords`` (B|1, Lq, 2), continuous (y, x) in unit coordinates of the
  valid area (``PositionEncoding.at``), so q.k depends only on the query-to-key offset; both by
  ``vispe.kernels.rope`` with the layer's ``rope_impl`` (block rotations, ``pe.block_size > 2``,
  through ``vispe.kernels.rope_blocks``: relative where the encoding is, i.e. ComRoPE, STRING,
  LieRE with 2x2 blocks);
* ``bias`` (B|1, heads, Lq, Lk), an additive logit bias from the caller (Plain-DETR's box bias).

Tokens are ``[prefix (P), grid (h*w, row-major)]``; a context without a grid (``shape=None``,
e.g. DETR's object queries) carries ``pos``, ``spatial`` and ``coords`` only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from timm.layers import Attention as TimmAttention
from torch import nn

from vispe import _checks
from vispe.coords import valid_extent
from vispe.encoding import BiasEncoding, PositionEncoding, RotaryEncoding
from vispe.kernels import bias_attention, grouped, relative_bias, rope


@dataclass
class PosContext:
    """Where the tokens of one forward pass are; built once per forward by the model."""

    shape: tuple[int, int] | None = None  # token grid (h, w); None for tokens without a grid
    num_prefix_tokens: int = 0
    mask: torch.Tensor | None = None  # (B, h, w) True = padding
    pos: torch.Tensor | None = None  # (B|1, P + h*w, C) additive code for q/k (DETR style)
    spatial: torch.Tensor | None = None  # (B|1, L, C) spatial code appended per head to q / k (Conditional DETR)
    coords: torch.Tensor | None = None  # (B|1, L, 2) unit (y, x) of tokens without a grid (rotary cross-attention)
    memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)  # tables shared by the layers
    segments: tuple[Segment, ...] | None = None  # a packed sequence (1, T, C): frames of several grids (Segment)

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


@dataclass(frozen=True)
class Segment:
    """``frames`` frames of one grid lying one after another in a packed sequence from row ``start``, each
    frame's P + h*w tokens contiguous; ``ctx`` is one frame's grid (shape, prefix tokens, mask
    (frames, h, w) or None) and its own memo, so every encoding keeps its meaning per frame."""

    start: int
    frames: int
    ctx: PosContext

    def __post_init__(self) -> None:
        if self.ctx.shape is None or self.frames < 1 or self.start < 0 or self.ctx.segments is not None:
            raise ValueError(f"Segment(start={self.start}, frames={self.frames}, shape={self.ctx.shape}): expected "
                             "start >= 0, frames >= 1 and a context with a grid (no nested segments)")

    @property
    def length(self) -> int:
        """Tokens of one frame (prefix and grid)."""
        h, w = cast(tuple[int, int], self.ctx.shape)
        return self.ctx.num_prefix_tokens + h * w


class Attention(TimmAttention):
    """timm's Attention plus an optional rotary or bias encoding ``pe`` and a ``PosContext``.

    Takes timm's constructor arguments (so it can be timm's ``attn_layer``), ``pe`` and the kernel
    choices ``rope_impl`` (``vispe.kernels.rope.ROPE_IMPLS``) and ``bias_impl``
    (``vispe.kernels.bias_attention.BIAS_IMPLS``), "auto" by default; ``vispe.kernels.set_impl``
    sets them on every layer of a model.
    """

    rope_impl: str = "auto"  # class defaults too, for timm layers converted in place (convert_vit)
    bias_impl: str = "auto"
    pe: PositionEncoding | None
    q_pos: nn.Linear | None
    k_pos: nn.Linear | None
    q_spatial: nn.Linear | None

    def __init__(self, dim: int, num_heads: int = 8, *, pe: PositionEncoding | None = None,
                 rope_impl: str = "auto", bias_impl: str = "auto", q_pos: bool = False, k_pos: bool = False,
                 spatial: bool = False, **kwargs: Any) -> None:
        _checks.positive_int("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim={dim}: expected a multiple of num_heads={num_heads}")
        if kwargs.get("gated"):
            raise ValueError("gated=True: vispe's Attention does not implement timm's output gate")
        if spatial and not k_pos:
            raise ValueError("spatial=True without k_pos=True: the keys' spatial part is projected by k_pos")
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.rope_impl = _checks.choice("rope_impl", rope_impl, rope.ROPE_IMPLS)
        self.bias_impl = _checks.choice("bias_impl", bias_impl, bias_attention.BIAS_IMPLS)
        A, bias = self.attn_dim, kwargs.get("qkv_bias", False)
        self.q_pos = nn.Linear(dim, A, bias=bias) if q_pos else None  # decoupled position projections
        self.k_pos = nn.Linear(dim, A, bias=bias) if k_pos else None
        self.q_spatial = nn.Linear(dim, A, bias=bias) if spatial else None
        self.pe = None
        self.set_pe(pe)

    @classmethod
    def adopt(cls, attn: TimmAttention) -> Attention:
        """Make a timm ``Attention`` this class in place (same weights; ``convert_vit``): the options
        its constructor would have set get their defaults (no position projections, no ``pe``)."""
        attn.__class__ = cls
        adopted = cast(Attention, attn)
        adopted.q_pos = adopted.k_pos = adopted.q_spatial = adopted.pe = None
        return adopted

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

    def forward(self, x: torch.Tensor, attn_mask: Any = None, is_causal: bool = False,
                ctx: PosContext | None = None, *, memory: torch.Tensor | None = None,
                memory_ctx: PosContext | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Self-attention over ``x`` (B, L, C), or cross-attention from ``x`` to ``memory`` (B, Lk, C);
        ``bias`` (B|1, heads, L, Lk) is added to the logits. With ``ctx.segments`` (a packed sequence,
        B = 1) ``attn_mask`` is None or one mask per segment (module docstring)."""
        if memory is not None:
            q, k, v = self._cross_qkv(x, ctx, memory, memory_ctx)  # q (B, heads, L, hd); k, v (B, heads, Lk, hd)
            q, k = self.q_norm(q), self.k_norm(k)
            if self.pe is not None:  # rotary (set_pe and _cross_qkv refuse the rest)
                q, k = self._rotate_cross(q, k, ctx, memory_ctx)
            q, k = self._spatial(q, k, ctx, memory_ctx)
            return self._out(self._attend(q, k, v, bias, attn_mask, memory_ctx, is_causal))
        if memory_ctx is not None:
            raise ValueError("memory_ctx is given without memory: expected memory=(B, Lk, C) for cross-attention")
        if ctx is not None and (ctx.spatial is not None or ctx.coords is not None):
            raise ValueError("ctx.spatial / ctx.coords are for cross-attention (queries against a memory "
                             "grid): expected memory=... or a context without them")
        if self.q_pos is not None or self.k_pos is not None:
            q, k, v = self._cross_qkv(x, ctx, x, ctx)  # decoupled projections: q, k, v apart
            qk = torch.stack([self.q_norm(q), self.k_norm(k)])  # (2, B, heads, L, hd)
        else:
            qk, v = self._qkv(x, ctx)  # (2, B, heads, L, hd), (B, heads, L, hd)
            qk = self._norm_qk(qk)
        if ctx is not None and ctx.segments is not None:
            return self._out(self._attend_segments(qk, v, ctx.segments, attn_mask, bias, is_causal))  # (1, T, C)
        q, k, logit_bias = self._encode(qk, ctx, bias)
        return self._out(self._attend(q, k, v, logit_bias, attn_mask, ctx, is_causal))

    def _out(self, x: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, heads, L, hd), or already merged (B, L, heads*hd), normed and projected.  # (B, L, C)"""
        if x.dim() == 4:
            x = x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.attn_dim)  # (B, L, heads*hd)
        return self.proj_drop(self.proj(self.norm(x)))

    def _encode(self, qk: torch.Tensor, ctx: PosContext | None, bias: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | relative_bias.RelativeBias | None]:
        """The layer's ``pe`` on self-attention's q and k (2, B, heads, L, hd) on the grid of ``ctx``: q, k
        rotated (rotary), or the logits bias (bias; with a caller's ``bias``, their dense sum)."""
        logit_bias: torch.Tensor | relative_bias.RelativeBias | None = bias  # (B|1, heads, L, L) or a table
        if self.pe is not None:
            if ctx is None or ctx.shape is None:
                raise ValueError(f"this layer has a {self.pe.family} encoding: expected a PosContext "
                                 "(ctx=...) giving the token grid")
            if self.pe.family == "rotary":
                qk = rope.rotate_qk(self.pe, qk, ctx.shape, ctx.mask, ctx.num_prefix_tokens, memo=ctx.memo,
                                    impl=self.rope_impl)  # (2, B, heads, L, hd)
            else:
                pe_bias = self._bias(qk[0], ctx)  # (B|1, heads, L, L), or its table (RelativeBias)
                if bias is None:
                    logit_bias = pe_bias
                else:  # with a caller's bias: the dense sum
                    dense = pe_bias.dense() if isinstance(pe_bias, relative_bias.RelativeBias) else pe_bias
                    logit_bias = dense + bias
        q, k = qk.unbind(0)
        return q, k, logit_bias

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                logit_bias: torch.Tensor | relative_bias.RelativeBias | None, attn_mask: Any, kv_ctx: PosContext | None, is_causal: bool) -> torch.Tensor:
        """SDPA of q (B, heads, L, hd) over k, v (B, heads, Lk, hd) with the keys' padding (``kv_ctx``), the
        logits bias, ``attn_mask`` (a mask or a ``TokenGroups``).  # (B, heads, L, hd)"""
        B = q.shape[0]
        kpm = kv_ctx.key_padding_mask if kv_ctx is not None else None
        if kpm is not None and kpm.shape != (B, k.shape[-2]):
            raise ValueError(f"the padding mask covers {tuple(kpm.shape)} (B, keys): expected ({B}, {k.shape[-2]})")
        dropout_p = self.attn_drop.p if self.training else 0.0
        if isinstance(attn_mask, grouped.TokenGroups):  # attention inside index sets (windows), no mask
            if logit_bias is not None or kpm is not None or is_causal:
                raise ValueError("attn_mask is a TokenGroups (attention inside index sets): expected no bias, no "
                                 "padding mask and is_causal=False with it (use a boolean attn_mask for those)")
            return attn_mask.attend(q, k, v, dropout_p=dropout_p)  # (B, heads, L, hd)
        if isinstance(logit_bias, relative_bias.RelativeBias):  # (B, heads, L, hd)
            return relative_bias.attend_relative(q, k, v, logit_bias, attn_mask=attn_mask, key_padding_mask=kpm,
                                                 dropout_p=dropout_p, is_causal=is_causal, impl=self.bias_impl)
        return bias_attention.attend(q, k, v, bias=logit_bias, attn_mask=attn_mask, key_padding_mask=kpm,
                                     dropout_p=dropout_p, is_causal=is_causal, impl=self.bias_impl)

    def _attend_segments(self, qk: torch.Tensor, v: torch.Tensor, segments: tuple[Segment, ...],
                         attn_mask: Any, bias: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """Self-attention of a packed sequence inside each segment: q, k, v (one split each, views) as
        (frames, heads, P + h*w, hd), the layer's ``pe`` on the segment's grid, the segment's mask
        (``attn_mask[i]``), the outputs back in one ``cat``.  # (1, T, heads*hd)"""
        if qk.shape[1] != 1 or bias is not None or is_causal:
            raise ValueError(f"ctx.segments (a packed sequence): expected x of one row (B=1, got {qk.shape[1]}), no "
                             "bias and is_causal=False")
        masks = [None] * len(segments) if attn_mask is None else list(attn_mask)
        if len(masks) != len(segments):
            raise ValueError(f"attn_mask has {len(masks)} entries: expected None or one per segment ({len(segments)})")
        rows, start = [], 0
        for i, seg in enumerate(segments):
            if seg.start != start:
                raise ValueError(f"ctx.segments[{i}].start={seg.start}: expected {start} (segments one after the other)")
            rows.append(seg.frames * seg.length)
            start += rows[-1]
        if start != qk.shape[-2]:
            raise ValueError(f"ctx.segments cover {start} tokens: expected the sequence's {qk.shape[-2]}")
        outs = []
        for seg, qk_s, v_s, mask in zip(segments, qk.split(rows, dim=-2), v.split(rows, dim=-2), masks):
            qk_s = qk_s.squeeze(1).unflatten(2, (seg.frames, seg.length)).transpose(1, 2)  # (2, S, heads, n, hd)
            v_s = v_s.squeeze(0).unflatten(1, (seg.frames, seg.length)).transpose(0, 1)  # (S, heads, n, hd)
            q, k, logit_bias = self._encode(qk_s, seg.ctx, None)
            o = self._attend(q, k, v_s, logit_bias, mask, seg.ctx, False)  # (S, heads, n, hd)
            outs.append(o.transpose(1, 2).reshape(-1, self.attn_dim))  # (S*n, heads*hd)
        return torch.cat(outs)[None]  # (1, T, heads*hd)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:  # (B, L, A) -> (B, heads, L, head_dim)
        return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def _project(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """``x`` through the rows ``rows`` of the fused qkv projection.  # (B, L, len(rows))"""
        bias = self.qkv.bias[rows] if self.qkv.bias is not None else None
        return F.linear(x, self.qkv.weight[rows], bias)

    def _qkv(self, x: torch.Tensor, ctx: PosContext | None) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k stacked (a view of the projection, no copy), and v.  # (2, B, heads, L, hd), (B, heads, L, hd)"""
        B, L, _ = x.shape
        split = lambda t, n: t.reshape(B, L, n, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # noqa: E731
        pos = _checked_pos(ctx, L, x, "ctx.pos")
        if pos is None:
            qk, v = split(self.qkv(x), 3).split([2, 1])  # (2, B, heads, L, hd), (1, B, heads, L, hd)
            return qk, v.squeeze(0)  # split/squeeze: one cat in backward, not two zero-filled buffers
        A = self.attn_dim
        qk = self._project(x + pos, slice(0, 2 * A))  # (B, L, 2A): position on q and k
        v = self._project(x, slice(2 * A, 3 * A))  # (B, L, A): none on v
        return split(qk, 2), self._heads(v)

    def _norm_qk(self, qk: torch.Tensor) -> torch.Tensor:  # (2, B, heads, L, hd)
        if isinstance(self.q_norm, nn.Identity) and isinstance(self.k_norm, nn.Identity):
            return qk
        return torch.stack([self.q_norm(qk[0]), self.k_norm(qk[1])])

    def _cross_qkv(self, x: torch.Tensor, ctx: PosContext | None, memory: torch.Tensor,
                   memory_ctx: PosContext | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if memory.dim() != 3 or memory.shape[0] != x.shape[0] or memory.shape[-1] != x.shape[-1]:
            raise ValueError(f"memory has shape {tuple(memory.shape)}: expected ({x.shape[0]}, Lk, {x.shape[-1]})")
        if self.pe is not None and self.pe.family != "rotary":
            raise ValueError(f"this layer has a {self.pe.family} encoding, which needs queries and keys on one "
                             "grid: cross-attention takes additive positions (ctx.pos, memory_ctx.pos), a "
                             "rotary encoding or a caller's bias")
        A = self.attn_dim
        qpos = _checked_pos(ctx, x.shape[1], x, "ctx.pos")
        kpos = _checked_pos(memory_ctx, memory.shape[1], memory, "memory_ctx.pos")
        q = self._project(x if qpos is None or self.q_pos else x + qpos, slice(0, A))  # (B, Lq, A)
        k = self._project(memory if kpos is None or self.k_pos else memory + kpos, slice(A, 2 * A))  # (B, Lk, A)
        if qpos is not None and self.q_pos is not None:
            q = q + self.q_pos(qpos)  # decoupled: W_q x + P_q pos
        if kpos is not None and self.k_pos is not None:
            k = k + self.k_pos(kpos)
        v = self._project(memory, slice(2 * A, 3 * A))  # (B, Lk, A)
        return self._heads(q), self._heads(k), self._heads(v)

    def _rotate_cross(self, q: torch.Tensor, k: torch.Tensor, ctx: PosContext | None,
                      memory_ctx: PosContext | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys rotated at their grid cells, queries at ``ctx.coords`` (unit (y, x)).  # q, k as given"""
        if memory_ctx is None or memory_ctx.shape is None or ctx is None or ctx.coords is None:
            raise ValueError("this layer has a rotary encoding: cross-attention needs memory_ctx with the keys' "
                             "grid (shape) and ctx.coords (B|1, Lq, 2), the queries' unit (y, x)")
        if memory_ctx.num_prefix_tokens:
            raise ValueError("rotary cross-attention: expected keys without prefix tokens (memory_ctx.num_prefix_tokens=0)")
        pe = cast(RotaryEncoding, self.pe)  # set_pe and _cross_qkv refuse the other families
        k = rope.rotate_qk(pe, k, memory_ctx.shape, memory_ctx.mask, 0, memo=memory_ctx.memo,
                           impl=self.rope_impl)  # (B, heads, Lk, hd)
        extent = valid_extent(memory_ctx.mask, memory_ctx.shape, device=q.device)  # (B|1, 2)
        q = rope.rotate_at(pe, q, ctx.coords, extent, impl=self.rope_impl)  # (B, heads, Lq, hd): same kernel
        return q, k

    def _spatial(self, q: torch.Tensor, k: torch.Tensor, ctx: PosContext | None,
                 memory_ctx: PosContext | None) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k with their spatial parts appended per head (Conditional DETR), or as given."""
        qs = ctx.spatial if ctx is not None else None
        ks = memory_ctx.spatial if memory_ctx is not None else None
        if qs is None and ks is None:
            return q, k
        if qs is None or ks is None or self.q_spatial is None or self.k_pos is None:
            raise ValueError("a spatial part needs ctx.spatial and memory_ctx.spatial together, on a layer built "
                             f"with spatial=True (got ctx.spatial {qs is not None}, memory_ctx.spatial "
                             f"{ks is not None}, spatial={self.q_spatial is not None})")
        qs = self._heads(self.q_spatial(qs.to(q.dtype))).expand(q.shape[0], -1, -1, -1)  # (B, heads, Lq, hd)
        ks = self._heads(self.k_pos(ks.to(k.dtype))).expand(k.shape[0], -1, -1, -1)  # (B, heads, Lk, hd)
        return torch.cat([q, qs], -1), torch.cat([k, ks], -1)  # (B, heads, L, 2 hd): scale 1/sqrt(2 hd)

    def _bias(self, q: torch.Tensor, ctx: PosContext) -> torch.Tensor | relative_bias.RelativeBias:
        """The encoding's logits bias (B|1, heads, L, L), or, for a bias of the offset alone, its
        table as a ``RelativeBias`` (``vispe.kernels.relative_bias``: never built in full on the CPU)."""
        L = q.shape[-2]
        pe = cast(BiasEncoding, self.pe)  # forward calls it for a bias encoding only
        shape = cast(tuple[int, int], ctx.shape)  # forward checked it
        parts = pe.relative(shape, device=q.device)
        if parts is not None:
            prefix = cast("tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None", parts[1])
            rel = relative_bias.RelativeBias(table=parts[0], shape=(shape[0], shape[1]), prefix=prefix,
                                             dense=lambda: self._dense_bias(q, ctx))
            if len(rel) != L:
                raise ValueError(f"the bias covers {len(rel)} tokens: expected {L} "
                                 f"(grid {ctx.shape} + {ctx.num_prefix_tokens} prefix tokens)")
            return rel
        return self._dense_bias(q, ctx)

    def _dense_bias(self, q: torch.Tensor, ctx: PosContext) -> torch.Tensor:
        pe = cast(BiasEncoding, self.pe)
        kw = {"q": q} if pe.contextual else {}
        bias: torch.Tensor = pe(ctx.shape, ctx.mask, device=q.device, dtype=q.dtype, **kw)  # (B|1, heads, L, L)
        L = q.shape[-2]
        if bias.shape[-2:] != (L, L):
            raise ValueError(f"the bias has shape {tuple(bias.shape)}: expected (..., {L}, {L}) "
                             f"(grid {ctx.shape} + {ctx.num_prefix_tokens} prefix tokens)")
        return bias


def _checked_pos(ctx: PosContext | None, L: int, x: torch.Tensor, name: str) -> torch.Tensor | None:
    """``ctx.pos`` checked against tokens ``x`` (B, L, C) and cast to their dtype, or None."""
    if ctx is None or ctx.pos is None:
        return None
    pos = ctx.pos
    if pos.dim() != 3 or pos.shape[0] not in (1, x.shape[0]) or pos.shape[-2:] != (L, x.shape[-1]):
        raise ValueError(f"{name} has shape {tuple(pos.shape)}: expected (B|1, {L}, {x.shape[-1]})")
    return pos.to(x.dtype)
