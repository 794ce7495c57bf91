"""timm's ``forward_intermediates`` for vispe's ViT and Eva (private; one function, both classes).

The models run their blocks through ``self._run_block(i, x, ctx)`` with the ``PosContext`` of
``self._tokens(x, mask)``, so the encoding (and the padding mask) reaches every block here too.
"""
from __future__ import annotations

import torch

from vispe import _checks


def forward_intermediates(self, x: torch.Tensor, indices=None, return_prefix_tokens: bool = False,
                          norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
                          intermediates_only: bool = False, mask: torch.Tensor | None = None):
    """timm's ``forward_intermediates`` (block outputs), with the encoding applied in every block."""
    from timm.models._features import feature_take_indices

    _checks.choice("output_fmt", output_fmt, ("NCHW", "NLC"))
    take, max_index = feature_take_indices(len(self.blocks), indices)
    x, ctx = self._tokens(x, mask)  # (B, P+N, C)
    B = x.shape[0]
    outs = []
    for i in range((max_index if stop_early else len(self.blocks) - 1) + 1):
        x = self._run_block(i, x, ctx)
        if i in take:
            outs.append(self.norm(x) if norm else x)
    P, (h, w) = self.num_prefix_tokens, ctx.shape
    prefix, outs = [y[:, :P] for y in outs], [y[:, P:] for y in outs]  # (B, P, C), (B, N, C)
    if output_fmt == "NCHW":
        outs = [y.reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous() for y in outs]  # (B, C, h, w)
    if return_prefix_tokens and P:
        outs = list(zip(outs, prefix))
    return outs if intermediates_only else (self.norm(x), outs)
