"""Attention with a 2D relative logits bias that is never materialised: the bias stays its table.

A relative bias on an (h, w) grid (Swin's ``relbias``, ``log_cpb``, non-contextual ``irpe``,
``relbias_axis``) is a function of the offset alone: with P prefix tokens first,

    bias[head, P + i, P + j] = table[(y_i - y_j + h - 1) * (2w - 1) + (x_i - x_j + w - 1), head]

plus learned prefix scalars (``vispe.image._bias``). ``RelativeBias`` carries that table
((2h-1)(2w-1), heads) and the prefix scalars; ``relative_attention`` runs attention with it on
the CPU without ever building the (heads, L, L) bias, nor its gradient, beyond one block:

* Keys in reverse grid order. With key j' = (h-1-y_j, w-1-x_j) the grid part of the bias is
  ``table2d[y_i + y'_j, x_i + x'_j]``, a Hankel pattern that is a *view* of the (heads, 2h-1, 2w-1)
  table with strides (2w-1, 1) over the queries' (y, x) and again over the keys'. A block of whole
  grid rows of queries is one ``copy_`` from that view (no index tensor, no gather); k and v are
  permuted once (attention does not depend on the order of its keys).
* Forward: for each block of heads and query rows, the fused SDPA kernel with the block as its
  mask (broadcast over the batch), keeping its log-sum-exp.
* Backward: per block, the scores are rebuilt from the same view and the log-sum-exp, and
  the gradients of q, k, v follow as in ``bias_attention.BiasedAttention`` (dP - D from one
  product of [dO | -D] and [v | 1]); in float32 from 512 keys on, the products go through oneDNN's
  linear (``torch.ops.mkldnn._linear_pointwise``; the bias minus the log-sum-exp added by its fused
  binary post-op), faster than torch's MKL ``bmm`` for these shapes on the AMD EPYC measured
  (``bench/bias_attention.py``: "vispe relative" against "vispe relative (bmm)"); elsewhere ``bmm``. The block's bias gradient, summed over the batch,
  is folded into the table at once: ``table2d[a, b]`` collects the scores with y_i + y'_j = a and
  x_i + x'_j = b (a loop of w shifted adds over x, then one of the block's rows over y), the prefix
  scalars their rows and columns.

What is kept for the backward is q, k, v, the output, the log-sum-exp and the small tables; the
temporaries are a few (rows, keys) blocks of ``chunk_bytes`` (``CHUNK_BYTES``, 4 MiB) and some
q-sized copies (keys reordered, [v | 1], the gradients). The dense bias, when a path needs one
(``"reference"``, torch.export, CUDA, and "auto" for a dense bias of at most ``DENSE_BYTES``, where
it costs less), is ``RelativeBias.dense()``: the encoding's own forward.

Under ``torch.compile`` on the CPU (float32) the same block loops run as the custom operators
``vispe::relative_bias_attention`` and ``vispe::relative_bias_attention_backward`` (opaque to the compiler,
whose graph keeps everything around them), so that a compiled model is not left with SDPA's math
kernel and a dense bias where the eager model has this kernel. The block loops themselves are in
``vispe.kernels._relative_blocks``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from vispe import _checks, _tracing
from vispe.kernels._relative_blocks import backward_blocks, forward_blocks
from vispe.kernels.bias_attention import BIAS_IMPLS, attend

#: the dense bias, (heads, L, L) float32, up to which "auto" builds it (SDPA's fused forward in one call
#: and the dense chunked backward, bias_attention): below it the relative kernel's per-block work costs
#: more than the bias (at 8x8 tokens, 8 images and 6 heads: 1.1-1.4x attention without bias, against
#: 1.7-3.8x for this kernel, bench/bias_attention.py)
DENSE_BYTES = 2 * 2**20

#: bytes of one (query rows, keys) float32 buffer: the forward's bias block; at most four live at once
#: in the backward (bias, P, dS and a batch sum); 6 MiB keeps one head of 1,024 tokens in one block
CHUNK_BYTES = 6 * 2**20


@dataclass
class RelativeBias:
    """A (1, heads, P+h*w, P+h*w) logits bias kept as its table over 2D offsets (module docstring).

    ``table`` ((2h-1)(2w-1), heads) float32; ``prefix`` None or (prefix_to_prefix (heads, P, P),
    prefix_to_token (heads, P), token_to_prefix (heads, P)) float32; ``dense`` returns the same
    bias as a tensor (the encoding's forward, for the paths that need one).
    """

    table: torch.Tensor
    shape: tuple[int, int]
    prefix: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    dense: Callable[[], torch.Tensor]

    def __post_init__(self) -> None:
        h, w = self.shape
        R = (2 * h - 1) * (2 * w - 1)
        if self.table.dim() != 2 or self.table.shape[0] != R:
            raise ValueError(f"table has shape {tuple(self.table.shape)}: expected ({R}, heads) for grid {self.shape}")

    @property
    def num_heads(self) -> int:
        return self.table.shape[1]

    @property
    def num_prefix_tokens(self) -> int:
        return 0 if self.prefix is None else self.prefix[0].shape[-1]

    @property
    def requires_grad(self) -> bool:
        return self.table.requires_grad or (self.prefix is not None and any(t.requires_grad for t in self.prefix))

    def __len__(self) -> int:  # tokens, P + h*w
        return self.num_prefix_tokens + self.shape[0] * self.shape[1]


def attend_relative(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: RelativeBias, *,
                    attn_mask: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, impl: str = "auto",
                    chunk_bytes: int | None = None) -> torch.Tensor:
    """``bias_attention.attend`` for a ``RelativeBias``.  # (B, heads, L, d)

    "chunked", and "auto" on the CPU when the dense bias would exceed ``DENSE_BYTES``, run
    ``relative_attention`` (with or without gradients, so that inference never builds the dense
    bias either; as the custom operator while torch.compile records). "auto" takes the dense bias
    (``bias.dense()``) to ``attend`` for smaller problems, on CUDA, under torch.export, with dropout,
    a causal mask or a caller's ``attn_mask``, as do "reference" and "flex".
    """
    _checks.choice("impl", impl, BIAS_IMPLS)
    plain = dropout_p == 0 and not is_causal and attn_mask is None
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    small = q.shape[1] * len(bias) ** 2 * 4 <= DENSE_BYTES
    if impl == "auto" and plain and not small and q.device.type == "cpu" and _compiled_op_fits(q, bias):
        return _op_attention(q, k, v, bias, key_padding_mask, chunk_bytes)  # torch.compile records
    if impl == "auto":
        fast = plain and not small and q.device.type == "cpu" and not _tracing.is_tracing()
    elif impl == "chunked":
        fast = plain and not _tracing.is_tracing()  # attend refuses the rest, with the reason
    else:
        fast = False
    if not fast:
        return attend(q, k, v, bias=bias.dense(), attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                      dropout_p=dropout_p, is_causal=is_causal, impl=impl, chunk_bytes=chunk_bytes)
    return relative_attention(q, k, v, bias, key_padding_mask, chunk_bytes)


def relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: RelativeBias,
                       key_padding_mask: torch.Tensor | None = None, chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias, padded keys hidden) v without the dense bias.  # (B, heads, L, d)

    q, k, v (B, heads, L, d) with L = P + h*w; key_padding_mask (B, L) bool, True = padding.
    """
    B, H, L, _ = q.shape
    if k.shape[2] != L or len(bias) != L or bias.num_heads != H:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and a relative bias of {bias.num_heads} heads "
                         f"over {len(bias)} tokens (grid {bias.shape} + {bias.num_prefix_tokens} prefix): expected "
                         "self-attention with one head count and token count")
    _checks.positive_int("chunk_bytes", chunk_bytes)
    prefix = bias.prefix if bias.prefix is not None else (None, None, None)
    with record_function("vispe::chunked_bias_attention"):  # the "chunked" path (vispe.kernels.explain)
        return RelativeBiasAttention.apply(q, k, v, bias.table, *prefix, key_padding_mask, bias.shape, chunk_bytes)




class RelativeBiasAttention(torch.autograd.Function):
    """Fused-kernel forward block by block, block-wise backward folding into the table (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, table, p2p, p2t, t2p, kpm, shape, chunk_bytes):
        out, lse = forward_blocks(q, k, v, table, p2p, p2t, t2p, kpm, shape, chunk_bytes)
        ctx.shape, ctx.chunk_bytes = shape, chunk_bytes
        ctx.save_for_backward(q, k, v, table, p2p, p2t, t2p, kpm, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        grads = backward_blocks(dout, *ctx.saved_tensors, ctx.shape, ctx.chunk_bytes, ctx.needs_input_grad[:7])
        return (*grads, None, None, None)


# --- the same kernel as custom operators, for torch.compile -----------------------------------------
def _compiled_op_fits(q: torch.Tensor, bias: RelativeBias) -> bool:
    """While torch.compile (not torch.export) records: float32 q and table (the fused kernel then
    gives the log-sum-exp the backward needs)."""
    return (torch.compiler.is_compiling() and not _tracing.is_exporting() and q.dtype == torch.float32
            and bias.table.dtype == torch.float32)


@torch.library.custom_op("vispe::relative_bias_attention", mutates_args=(), device_types="cpu")
def _op_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, p2p: torch.Tensor | None,
                p2t: torch.Tensor | None, t2p: torch.Tensor | None, kpm: torch.Tensor | None, h: int, w: int,
                chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = forward_blocks(q, k, v, table, p2p, p2t, t2p, kpm, (h, w), chunk_bytes)
    if lse is None:
        raise RuntimeError("vispe::relative_bias_attention: the fused SDPA kernel gave no log-sum-exp (float32 on "
                           "the CPU expected); run the model eagerly or set bias_impl='reference'")
    return out.contiguous(), lse.contiguous()


@_op_forward.register_fake
def _(q, k, v, table, p2p, p2t, t2p, kpm, h, w, chunk_bytes):
    return q.new_empty(q.shape[:-1] + v.shape[-1:]), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("vispe::relative_bias_attention_backward", mutates_args=(), device_types="cpu")
def _op_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                 p2p: torch.Tensor | None, p2t: torch.Tensor | None, t2p: torch.Tensor | None,
                 kpm: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, h: int, w: int,
                 chunk_bytes: int) -> list[torch.Tensor]:
    grads = backward_blocks(dout, q, k, v, table, p2p, p2t, t2p, kpm, out, lse, (h, w), chunk_bytes, (True,) * 7)
    return [g.contiguous() if g is not None else q.new_empty(0) for g in grads]


@_op_backward.register_fake
def _(dout, q, k, v, table, p2p, p2t, t2p, kpm, out, lse, h, w, chunk_bytes):
    return [t.new_empty(t.shape) if t is not None else q.new_empty(0) for t in (q, k, v, table, p2p, p2t, t2p)]


def _setup(ctx, inputs, output):
    q, k, v, table, p2p, p2t, t2p, kpm, h, w, chunk_bytes = inputs
    ctx.save_for_backward(q, k, v, table, p2p, p2t, t2p, kpm, *output)
    ctx.sizes = (h, w, chunk_bytes)


def _backward(ctx, dout, _dlse):
    saved = ctx.saved_tensors
    grads = _op_backward(dout, *saved, *ctx.sizes)
    return (*grads[:4], *(g if t is not None else None for g, t in zip(grads[4:], saved[4:7])), None, None, None, None)


_op_forward.register_autograd(_backward, setup_context=_setup)


def _op_attention(q, k, v, bias: RelativeBias, kpm, chunk_bytes):
    p2p, p2t, t2p = bias.prefix if bias.prefix is not None else (None, None, None)
    return _op_forward(q, k, v, bias.table, p2p, p2t, t2p, kpm, bias.shape[0], bias.shape[1], chunk_bytes)[0]
