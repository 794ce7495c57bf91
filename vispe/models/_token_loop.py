"""The token loop shared by vispe's ViT and Eva (private): a mixin put before the timm class.

A model provides ``_tokens(x, mask) -> (tokens (B, P+N, C), PosContext)`` and
``_run_block(i, x, ctx)``; this gives it timm's ``forward_features`` / ``forward`` /
``forward_intermediates`` with the encoding (and the padding mask) reaching every block, and the
PEG step (a conditional encoding applied to the grid tokens after a block).
"""
from __future__ import annotations

import torch

from vispe import _checks
from vispe.attention import PosContext


class TokenLoop:
    def _apply_peg(self, x: torch.Tensor, ctx: PosContext) -> torch.Tensor:
        """The conditional encoding on the grid tokens; prefix tokens pass unchanged."""
        P, (h, w) = ctx.num_prefix_tokens, ctx.shape
        grid = x[:, P:].transpose(1, 2).reshape(x.shape[0], -1, h, w)  # (B, C, h, w)
        grid = grid + self.pe(grid, ctx.mask)
        return torch.cat([x[:, :P], grid.flatten(2).transpose(1, 2)], dim=1)  # (B, P+N, C)

    def forward_tokens(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """Images (B, C, H, W) [+ padding mask (B, H, W), True = padding] -> (tokens (B, P+N, C), ctx)."""
        x, ctx = self._tokens(x, mask)
        for i in range(len(self.blocks)):
            x = self._run_block(i, x, ctx)
        return self.norm(x), ctx

    def forward_features(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_tokens(x, mask)[0]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x, ctx = self.forward_tokens(x, mask)
        return self.forward_head(x, mask=ctx.mask)

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
