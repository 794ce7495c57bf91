"""Fast paths behind ``vispe.attention.Attention``: RoPE tables and rotation (``rope``), a relative
bias kept as its table, never built in full (``relative_bias``), any other learned bias without
SDPA's math kernel (``bias_attention``), and which kernel ran (``explain``)."""
from __future__ import annotations

from torch import nn

from vispe import _checks
from vispe.kernels.bias_attention import BIAS_IMPLS
from vispe.kernels.rope import ROPE_IMPLS


def set_impl(model: nn.Module, *, rope: str | None = None, bias: str | None = None) -> int:
    """Set ``rope_impl`` and/or ``bias_impl`` on every vispe ``Attention`` of ``model``; returns how many."""
    from vispe.attention import Attention

    if rope is not None:
        _checks.choice("rope", rope, ROPE_IMPLS)
    if bias is not None:
        _checks.choice("bias", bias, BIAS_IMPLS)
    n = 0
    for m in model.modules():
        if isinstance(m, Attention):
            m.rope_impl = rope if rope is not None else m.rope_impl
            m.bias_impl = bias if bias is not None else m.bias_impl
            n += 1
    return n
