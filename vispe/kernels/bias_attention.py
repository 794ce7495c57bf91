"""Attention with a learned additive bias, without SDPA's math kernel.

``scaled_dot_product_attention`` with a float ``attn_mask`` that needs a gradient has only one
kernel on the CPU, the math one, which keeps the full (B, heads, L, L) probabilities for the
backward pass (about 8x the memory of the fused kernels, and 3x the time at 1,024 tokens). Here:

* ``"reference"``: SDPA with the bias as ``attn_mask`` (padded keys set to -inf), as torch does it.
* ``"chunked"`` (CPU default when the bias needs a gradient): ``BiasedAttention``, an autograd
  function whose forward runs the fused SDPA kernel with the bias detached, and whose backward
  recomputes the probabilities block by block (a few batch items, else a few heads of one item
  with all their rows, else query rows of one head; at most ``chunk_bytes`` per block) to give the
  gradients of q, k, v and the bias. No (B, heads, L, L) tensor is ever kept beyond one block
  (``default_chunk_bytes``: at most ``CHUNK_BYTES``); with a key padding mask the forward also
  runs block by block, so the per-batch masked bias is never built beyond one block either.
* ``"flex"``: ``torch.nn.attention.flex_attention`` with a ``score_mod`` that reads the bias
  ``(B|1, heads, L, L)`` at (b, h, q, k) and -inf for padded keys, compiled on CUDA. Forward only
  on the CPU (torch has no CPU backward for flex attention).
* ``"auto"`` (default): "reference" when the bias needs no gradient (SDPA then runs its fused
  kernel with a constant mask), with dropout or a causal mask (which the others do not implement),
  or on CUDA (whose memory-efficient kernel computes the bias gradient itself; "flex" is opt-in
  there); "chunked" otherwise. While ``torch.compile`` or ``torch.export`` records the model
  (``vispe._tracing.is_tracing``) "auto" is "reference", whatever the sizes: the chunked kernel's
  blocks are Python loops over the input's sizes, which are symbolic there (a forced "chunked"
  is refused with that reason). Under ``torch.export`` with grad enabled, "reference" writes the
  softmax out (``_math``) instead of calling SDPA, whose recorded output layout the ONNX exporter
  does not reproduce.

Backward of one block, with S = scale q k^T + bias, P = softmax(S), dO the output gradient and
D = rowsum(dO * O):  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  d bias = dS,
dQ = scale dS K,  dK = scale dS^T Q.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from vispe import _checks, _tracing

BIAS_IMPLS = ("auto", "reference", "chunked", "flex")
CHUNK_BYTES = 8 * 2**20  # float32 scores per block in the chunked backward (bench/bias_attention.py)


def default_chunk_bytes(total: int) -> int:
    """Block size of the chunked backward for ``total`` bytes of float32 scores: the fewest blocks
    of at most ``CHUNK_BYTES``, of equal size. Small problems run as one block (each block costs a
    dozen kernel launches, and as many thread wake-ups under ``OMP_WAIT_POLICY=PASSIVE``: a
    ViT's 65 tokens ran 10% faster in one block than in four)."""
    n = max(1, -(-total // CHUNK_BYTES))  # blocks
    return max(1, -(-total // n))


def pick_impl(impl: str, q: torch.Tensor, bias: torch.Tensor | None, *, dropout_p: float = 0.0,
              is_causal: bool = False) -> str:
    """The path ``attend`` takes for these inputs (module docstring); a forced path it cannot take
    is a ValueError."""
    _checks.choice("impl", impl, BIAS_IMPLS)
    if bias is None:
        return "reference"
    if impl == "auto":
        needs_grad = torch.is_grad_enabled() and bias.requires_grad
        if not needs_grad or dropout_p > 0 or is_causal or q.device.type != "cpu" or _tracing.is_tracing():
            return "reference"
        return "chunked"
    if impl == "chunked" and _tracing.is_tracing():
        raise ValueError("impl='chunked' while torch.compile / torch.export records: its block sizes are "
                         "computed from the input's shape, which is symbolic there; expected impl='auto' or "
                         "'reference' (vispe.kernels.set_impl(model, bias='auto')), or export with "
                         "vispe.export.export_onnx / vispe.export.export")
    if impl != "reference" and (dropout_p > 0 or is_causal):
        raise ValueError(f"impl={impl!r} with dropout_p={dropout_p}, is_causal={is_causal}: expected "
                         "dropout_p=0 and is_causal=False (only impl='reference' implements them)")
    if impl == "flex" and q.device.type == "cpu" and torch.is_grad_enabled() and (
            bias.requires_grad or q.requires_grad):
        raise ValueError("impl='flex' on the CPU needs torch.no_grad(): torch has no CPU backward for "
                         "flex_attention (use 'chunked' to train on the CPU)")
    return impl


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: torch.Tensor | None = None,
           attn_mask: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
           dropout_p: float = 0.0, is_causal: bool = False, impl: str = "auto",
           chunk_bytes: int | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias + attn_mask, padded keys hidden) v.  # (B, heads, Lq, d)

    q (B, heads, Lq, d); k, v (B, heads, Lk, d); bias (B|1, heads, Lq, Lk) float; attn_mask as
    SDPA's (bool True = attend, or float); key_padding_mask (B, Lk) bool, True = padding.
    """
    path = pick_impl(impl, q, bias, dropout_p=dropout_p, is_causal=is_causal)
    if path == "reference":
        return _reference(q, k, v, bias, attn_mask, key_padding_mask, dropout_p, is_causal)
    if attn_mask is not None:  # fold the caller's mask into the bias
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=bias.dtype, device=bias.device).masked_fill(
                ~attn_mask, float("-inf"))
        bias = bias + attn_mask
    if bias.dim() != 4 or bias.shape[0] not in (1, q.shape[0]) or bias.shape[1] not in (1, q.shape[1]):
        raise ValueError(f"bias has shape {tuple(bias.shape)}: expected (B|1, heads|1, Lq, Lk) for q {tuple(q.shape)}")
    bias = bias.expand(-1, q.shape[1], q.shape[2], k.shape[2])
    if path == "flex":
        with record_function("vispe::flex_attention"):  # named for vispe.kernels.explain
            return _flex(q, k, v, bias, key_padding_mask)
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * 4)
    _checks.positive_int("chunk_bytes", chunk_bytes)
    with record_function("vispe::chunked_bias_attention"):
        return BiasedAttention.apply(q, k, v, bias, key_padding_mask, chunk_bytes)


def _reference(q, k, v, bias, attn_mask, kpm, dropout_p, is_causal):
    mask = attn_mask
    if bias is not None:
        if mask is None:
            mask = bias
        elif mask.dtype == torch.bool:  # True = attend (SDPA's convention), not +1
            mask = bias.masked_fill(~mask, float("-inf"))
        else:
            mask = mask + bias
    if kpm is not None:
        if mask is None:
            mask = ~kpm[:, None, None, :]  # (B, 1, 1, Lk) True = attend
        elif mask.dtype == torch.bool:
            mask = mask & ~kpm[:, None, None, :]
        else:
            mask = mask.masked_fill(kpm[:, None, None, :], float("-inf"))  # (B, heads, Lq, Lk)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    if (_tracing.is_exporting() and torch.is_grad_enabled() and mask is not None and mask.requires_grad
            and dropout_p == 0 and not is_causal):
        return _math(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)


def _math(q, k, v, mask):
    """softmax(q k^T / sqrt(d) + mask) v written out, for torch.export with grad enabled.  # (B, heads, Lq, d)

    There SDPA with a float mask that needs a gradient is recorded with the fused kernel's output
    layout, and the ONNX exporter's decompositions give the math kernel's: the caller's transpose +
    reshape, recorded as a view, then fails ("Cannot view a tensor with shape ...", torch 2.14).
    Explicit products have one layout for every tracer."""
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1])) + mask  # (B, heads, Lq, Lk)
    return torch.matmul(torch.softmax(s, dim=-1), v)


def _blocks(B: int, H: int, Lq: int, Lk: int, chunk_bytes: int, itemsize: int = 4):
    """(batch, head, query-row) slices of about ``chunk_bytes`` of scores (``itemsize`` bytes each,
    float32 by default) each: several batch items when one fits, else several heads of one item
    with all their rows (fewer, larger matrix products), else rows of one head."""
    per_item, per_head = H * Lq * Lk * itemsize, Lq * Lk * itemsize
    every_head, every_row = slice(0, H), slice(0, Lq)
    if per_item <= chunk_bytes:
        nb = max(1, chunk_bytes // per_item) if per_item else max(B, 1)  # per_item 0: no query rows
        for b in range(0, B, nb):
            yield slice(b, min(b + nb, B)), every_head, every_row
    elif per_head <= chunk_bytes:
        nh = -(-H // -(-H // (chunk_bytes // per_head)))  # heads per block, blocks of equal size
        for b in range(B):
            for h in range(0, H, nh):
                yield slice(b, b + 1), slice(h, min(h + nh, H)), every_row
    else:
        most = max(1, chunk_bytes // (Lk * itemsize))  # rows that fit
        nr = -(-Lq // -(-Lq // most))  # rows per block (<= most), blocks of equal size
        for b in range(B):
            for h in range(H):
                for r in range(0, Lq, nr):
                    yield slice(b, b + 1), slice(h, h + 1), slice(r, min(r + nr, Lq))


def _block_bias(bias, kpm, bs, hs, rs, out, shift=None):
    """The bias of one block, padded keys at -inf, minus ``shift`` (nb, nh, nr, 1) if given, written
    into ``out`` (nb, nh, nr, Lk) in one pass where possible."""
    blk = bias.detach()[bs if bias.shape[0] > 1 else slice(0, 1), hs, rs]  # (nb|1, nh, nr, Lk)
    if kpm is not None:  # copy_ converts the dtype (a bfloat16 bias into the float32 scores)
        out = out.copy_(blk).masked_fill_(kpm[bs, None, None, :], float("-inf"))
        return out if shift is None else out.sub_(shift)
    return out.copy_(blk) if shift is None else torch.sub(blk, shift, out=out)


def _flat(t: torch.Tensor) -> torch.Tensor:  # (nb, H, n, m) -> (nb*H, n, m), a view when possible
    return t.reshape(-1, t.shape[-2], t.shape[-1])


class BiasedAttention(torch.autograd.Function):
    """Fused-kernel forward with the bias detached; block-wise backward (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, bias, kpm, chunk_bytes):
        B, H, Lq, _ = q.shape
        Lk = k.shape[2]
        lse = None  # log-sum-exp of every score row, when the kernel gives it: P = exp(S - lse) in backward
        if kpm is None:
            out, lse = _sdpa(q, k, v, bias.detach().to(q.dtype))
        else:  # per block of batch items, so that the masked bias is never (B, H, L, L) at once
            out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
            lse, parts = q.new_empty(q.shape[:-1], dtype=torch.float32), True
            for bs, hs, _ in _blocks(B, H, Lq, Lk, max(chunk_bytes, H * Lq * Lk * 4)):
                mask = torch.empty((bs.stop - bs.start, H, Lq, Lk), dtype=q.dtype, device=q.device)
                out[bs], part = _sdpa(q[bs], k[bs], v[bs], _block_bias(bias, kpm, bs, hs, slice(None), mask))
                if part is None:
                    parts = False
                else:
                    lse[bs] = part
            lse = lse if parts else None
        ctx.chunk_bytes = chunk_bytes
        ctx.save_for_backward(q, k, v, bias, kpm, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, bias, kpm, out, lse = ctx.saved_tensors
        B, H, Lq, d = q.shape
        Lk = k.shape[2]
        wd = torch.promote_types(q.dtype, torch.float32)
        scale = 1.0 / math.sqrt(d)
        need_q, need_k, need_v, need_b = ctx.needs_input_grad[:4]
        new = lambda t, fill: (torch.zeros if fill else torch.empty)(t.shape, dtype=wd, device=t.device)  # noqa: E731
        dq = new(q, False) if need_q else None
        dk = new(k, True) if need_k else None
        dv = new(v, True) if need_v else None
        db = new(bias, True) if need_b else None
        neg_d = -(dout.to(wd) * out.to(wd)).sum(-1, keepdim=True)  # -D (B, H, Lq, 1)
        for bs, hs, rs in _blocks(B, H, Lq, Lk, ctx.chunk_bytes, wd.itemsize):  # scores in the working dtype
            nb, nh, nr = bs.stop - bs.start, hs.stop - hs.start, rs.stop - rs.start
            qc = _flat(q[bs, hs, rs].to(wd))  # (nb*nh, nr, d)
            do = _flat(dout[bs, hs, rs].to(wd))  # (nb*nh, nr, d)
            kc, vc = _flat(k[bs, hs].to(wd)), _flat(v[bs, hs].to(wd))  # (nb*nh, Lk, d)
            s = torch.empty((nb, nh, nr, Lk), dtype=wd, device=q.device)
            if lse is not None:  # P = exp(S - lse), in place
                s = _block_bias(bias, kpm, bs, hs, rs, s, lse[bs, hs, rs, None])
                p = _flat(s).baddbmm_(qc, kc.transpose(1, 2), alpha=scale).exp_()
                ds = torch.baddbmm(_flat(neg_d[bs, hs, rs]), do, vc.transpose(1, 2))  # dP - D
            else:
                s = _flat(_block_bias(bias, kpm, bs, hs, rs, s)).baddbmm_(qc, kc.transpose(1, 2), alpha=scale)  # S
                p = torch.softmax(s, dim=-1)
                ds = torch.baddbmm(_flat(neg_d[bs, hs, rs]), do, vc.transpose(1, 2), out=s)  # dP - D
            ds.mul_(p)  # dS = P * (dP - D)
            if need_v:
                _flat(dv[bs, hs]).baddbmm_(p.transpose(1, 2), do)
            del p
            if need_b:
                ds4 = ds.view(nb, nh, nr, Lk)
                if bias.shape[0] == 1 and B > 1:
                    db[:, hs, rs] += ds4.sum(0, keepdim=True) if nb > 1 else ds4
                else:
                    db[bs, hs, rs] += ds4
            if need_q:
                dq[bs, hs, rs].view(-1, nr, d).baddbmm_(ds, kc, beta=0, alpha=scale)  # a view: blocks are contiguous in dq
            if need_k:
                _flat(dk[bs, hs]).baddbmm_(ds.transpose(1, 2), qc, alpha=scale)
        cast = lambda g, like: None if g is None else g.to(like.dtype)  # noqa: E731
        return cast(dq, q), cast(dk, k), cast(dv, v), cast(db, bias), None, None


def _sdpa(q, k, v, mask):
    """SDPA's output and, from the fused CPU kernel when this torch has it, its log-sum-exp (else None)."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None and q.device.type == "cpu" and q.dtype == torch.float32:
        try:
            out, lse = op(q, k, v, 0.0, False, attn_mask=mask)
            return out, lse
        except RuntimeError:  # a layout or version the private operator refuses: the public call
            pass
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None


_compiled_flex = None


def _flex(q, k, v, bias, kpm):
    """flex_attention reading ``bias`` (B|1, H, Lq, Lk) in its score_mod; compiled on CUDA."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    batched = bias.shape[0] > 1

    def score_mod(score, b, h, qi, ki):
        s = score + (bias[b, h, qi, ki] if batched else bias[0, h, qi, ki])
        if kpm is not None:
            s = torch.where(kpm[b, ki], float("-inf"), s)
        return s

    fn = flex_attention
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        fn = _compiled_flex
    return fn(q, k, v, score_mod=score_mod)
