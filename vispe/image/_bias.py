"""Shared plumbing of the 2D bias encodings (private): arguments, prefix rule, float32 output.

``BiasBase`` checks the arguments every bias encoding takes, owns the learned prefix scalars and
turns the subclass's grid bias ``grid_bias(shape, device, q)`` (float32, (1|B, heads, N, N)) into
the contract's ``(1|B, heads, P+N, P+N)``, computed with autocast off and cast to ``dtype`` last.

Relative form: a bias that depends on the offset alone (relbias, log_cpb, non-contextual iRPE,
relbias_axis) also gives ``relative_table(shape, device)``, the table over every offset the grid
has, ((2h-1)(2w-1), heads) float32 at row ``(y_i - y_j + h - 1) * (2w - 1) + (x_i - x_j + w - 1)``
(query minus key), so that ``grid_bias == gather_bias(relative_table, relative_position_index)``.
``relative(shape)`` returns it with the prefix scalars: what ``vispe.kernels.relative_bias`` runs
attention with, without the (heads, L, L) bias.

Prefix tokens (class, register), BEiT's rule generalised to P tokens, zero-initialised:

* ``prefix_to_token`` (heads, P):   logit bias of prefix query p to every grid key
* ``token_to_prefix`` (heads, P):   logit bias of every grid query to prefix key p
* ``prefix_to_prefix`` (heads, P, P): prefix query p to prefix key p'

With P = 1 this is BEiT's three extra table entries (timm's ``gen_relative_position_index`` with
``class_token=True``). Padding mask: padded keys are hidden by the attention's key-padding mask; a
bias that depends on the padding mask (``mask_aware``: LookHere's centre heads) gets it as
``grid_bias(..., mask=mask)``, the others do not see it.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.coords import float32_math
from vispe.encoding import BiasEncoding


def gather_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` as a contiguous (1, heads, N, N) bias: index_select along the table's rows
    on its (heads, L) transpose, so that the backward is one ``index_add_`` (16x faster on the CPU
    at 32x32 tokens than the ``index_put_`` of ``table[index].permute(...)``, timm's form).

    table (L, heads); index (N, N) long into L.  # (1, heads, N, N)
    """
    n = index.shape
    return table.t().contiguous().index_select(1, index.reshape(-1)).view(1, table.shape[1], *n)


class BiasBase(BiasEncoding):
    """Base of vispe's 2D bias encodings. Subclasses implement ``grid_bias``.

    Args (shared by every 2D bias):
        num_heads: attention heads.
        num_prefix_tokens: P prefix tokens with their own learned bias scalars (module docstring).
        dim: model width; with ``head_dim`` it must equal ``num_heads * head_dim``, alone a
            multiple of ``num_heads``.
        head_dim: channels per head; needed by a contextual bias (else taken as dim / num_heads).
        grid: the grid the model is built for (used by encodings that store a table for it).
        contextual: whether the bias depends on the queries (``forward`` then needs ``q``).
    """

    def __init__(self, num_heads: int, num_prefix_tokens: int = 0, *, dim: int | None = None,
                 head_dim: int | None = None, grid=None, contextual: bool = False) -> None:
        super().__init__()
        self.num_heads = _checks.positive_int("num_heads", num_heads)
        self.num_prefix_tokens = P = _checks.positive_int("num_prefix_tokens", num_prefix_tokens, allow_zero=True)
        if head_dim is not None:
            _checks.positive_int("head_dim", head_dim)
        if dim is not None:
            _checks.positive_int("dim", dim)
            if head_dim is not None and dim != num_heads * head_dim:
                raise ValueError(f"dim={dim}: expected num_heads * head_dim = {num_heads} * {head_dim} "
                                 f"= {num_heads * head_dim}")
            if dim % num_heads:
                raise ValueError(f"dim={dim}: expected a multiple of num_heads={num_heads}")
            head_dim = head_dim if head_dim is not None else dim // num_heads
        if not isinstance(contextual, bool):
            raise ValueError(f"contextual={contextual!r}: expected True or False")
        if contextual and head_dim is None:
            raise ValueError("head_dim=None: expected a positive integer (a contextual bias learns "
                             "head_dim-sized vectors; pass head_dim or dim)")
        self.dim, self.head_dim, self.contextual = dim, head_dim, contextual
        self.grid = None if grid is None else _checks.grid_shape("grid", grid)
        if P:
            self.prefix_to_token = nn.Parameter(torch.zeros(num_heads, P))  # (heads, P)
            self.token_to_prefix = nn.Parameter(torch.zeros(num_heads, P))  # (heads, P)
            self.prefix_to_prefix = nn.Parameter(torch.zeros(num_heads, P, P))  # (heads, P, P)

    def grid_bias(self, shape: tuple[int, int], device: torch.device,
                  q: torch.Tensor | None) -> torch.Tensor:
        """Float32 bias among the grid tokens.  # (1|B, heads, N, N)"""
        raise NotImplementedError

    def relative_table(self, shape: tuple[int, int], device: torch.device) -> torch.Tensor | None:
        """The grid bias as a table over offsets (module docstring), or None when it is not a
        function of the offset alone.  # ((2h-1)(2w-1), heads) float32"""
        return None

    def relative(self, shape, *, device=None):
        """``(table, prefix)``: ``relative_table`` and the prefix scalars (prefix_to_prefix (heads, P, P),
        prefix_to_token (heads, P), token_to_prefix (heads, P), float32; None without prefix tokens),
        or None when the bias is not relative (contextual, or another kind)."""
        if self.contextual:
            return None
        shape = _checks.grid_shape("shape", shape)
        device = self.resolve_device(device)
        with float32_math(device):
            table = self.relative_table(shape, device)
            if table is None:
                return None
            prefix = None
            if self.num_prefix_tokens:
                prefix = tuple(t.to(device, torch.float32) for t in
                               (self.prefix_to_prefix, self.prefix_to_token, self.token_to_prefix))
        return table, prefix

    def _check_q(self, q, n: int) -> torch.Tensor:
        L = self.num_prefix_tokens + n

        def want() -> str:  # formatted only for the error: formatting a symbolic size while
            # torch.compile records would specialise the graph to it (a recompile at every size)
            return f"(B, {self.num_heads}, {L}, {self.head_dim})"

        if not isinstance(q, torch.Tensor):
            raise ValueError(f"q={type(q).__name__}: a contextual bias needs the queries {want()}")
        if q.dim() != 4 or tuple(q.shape[1:]) != (self.num_heads, L, self.head_dim):
            raise ValueError(f"q has shape {tuple(q.shape)}: expected {want()} (P + h*w tokens)")
        return q

    def add_prefix(self, bias: torch.Tensor) -> torch.Tensor:
        """(Bb, heads, N, N) -> (Bb, heads, P+N, P+N) with the learned prefix scalars, float32."""
        P = self.num_prefix_tokens
        if not P:
            return bias
        Bb, H, N, _ = bias.shape
        dev = bias.device
        p2p = self.prefix_to_prefix.to(dev, torch.float32)[None].expand(Bb, H, P, P)
        p2t = self.prefix_to_token.to(dev, torch.float32)[None, :, :, None].expand(Bb, H, P, N)
        t2p = self.token_to_prefix.to(dev, torch.float32)[None, :, None, :].expand(Bb, H, N, P)
        top = torch.cat([p2p, p2t], dim=-1)  # (Bb, H, P, P+N)
        bottom = torch.cat([t2p, bias], dim=-1)  # (Bb, H, N, P+N)
        return torch.cat([top, bottom], dim=-2)  # (Bb, H, P+N, P+N)

    def forward(self, shape, mask: torch.Tensor | None = None, *, device=None, dtype=None,
                q: torch.Tensor | None = None) -> torch.Tensor:
        """Attention-logit bias.  # (1|B, heads, P+h*w, P+h*w), float32 or ``dtype``"""
        shape = _checks.grid_shape("shape", shape)
        _checks.mask_for("mask", mask, shape)
        if self.contextual:
            q = self._check_q(q, shape[0] * shape[1])
        else:
            q = None  # a non-contextual bias does not read the queries
        device = self.resolve_device(device, q)
        with float32_math(device):
            kw = {"mask": mask} if self.mask_aware else {}  # a mask-aware bias reads the padding mask
            bias = self.add_prefix(self.grid_bias(shape, device, q, **kw))  # (1|B, H, P+N, P+N) float32
        return bias if dtype is None else bias.to(dtype)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_prefix_tokens={self.num_prefix_tokens}, "
                f"contextual={self.contextual}")
