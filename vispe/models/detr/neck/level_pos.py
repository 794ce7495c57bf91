"""Position of multi-scale tokens: any additive vispe encoding per level, plus a level embedding.

Deformable DETR (Zhu et al., 2021) gives every encoder token ``pos = sine_l + e_l``: the 2D sine
code of its cell on its own level's map, counted over the image's valid area of that level
(mask-aware), plus a learned vector ``e_l`` per level (``level_embed``, (L, d), initialised N(0, 1)
as the papers), because the sine alone says where a token is, not on which level. Here the sine is
any *additive* vispe encoding (``sine`` with ``DEFORMABLE_SINE`` is the papers'), evaluated level by
level with that level's mask, and the level embedding is an option (``level_pe``: "learned" or
None)::

    pos = concat_l [ pe((h_l, w_l), mask_l) + e_l ]                    # (B|1, N, d)

Rotary and bias encodings cannot take part: deformable attention has no query-key dot product
(the query predicts offsets and weights; keys are only sampled), so there is nothing to rotate or
bias; they are refused here with that reason. Conditional ones (PEG) act on the feature maps and
belong to the backbone side.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.encoding import PositionEncoding
from vispe.kernels.deformable import Levels
from vispe.models.detr.design.rules import check_deformable_pe

#: the level embeddings: the papers' learned one or none (``create_detr(level_pe=...)``; None is "none")
LEVEL_PES = ("learned", "none")
#: ``vispe.build("sine", dim=d, **DEFORMABLE_SINE)`` is Deformable DETR's position embedding: cell
#: centres (offset -0.5) over the valid area, scale 2 pi, temperature 10000, y channels first.
DEFORMABLE_SINE = dict(offset=-0.5, normalize=True, temperature=10000.0, layout="interleaved", eps=1e-6)


class LevelPositions(nn.Module):
    """The additive code of every multi-scale token (module docstring).

    Args:
        pe: an additive vispe encoding of dim ``d_model`` shared by the levels, or None / the "none"
            encoding (no 2D code).
        d_model: channels.
        num_levels: levels L (rows of ``level_embed``).
        level_pe: "learned" (the papers' ``level_embed``), "none" or None (no level embedding).
    """

    def __init__(self, pe: PositionEncoding | None, d_model: int, num_levels: int, level_pe: str | None = "learned") -> None:
        super().__init__()
        check_deformable_pe(pe)
        pe = None if pe is not None and pe.family == "none" else pe  # the "none" encoding: no 2D code
        if pe is not None and getattr(pe, "dim", d_model) != d_model:
            raise ValueError(f"pe has dim={pe.dim}: expected d_model={d_model}")
        self.pe, self.d_model = pe, _checks.positive_int("d_model", d_model)
        self.num_levels = _checks.positive_int("num_levels", num_levels)
        level_pe = _checks.choice("level_pe", "none" if level_pe is None else level_pe, LEVEL_PES)
        self.level_pe = None if level_pe == "none" else level_pe
        self.level_embed = nn.Parameter(torch.empty(num_levels, d_model)) if level_pe == "learned" else None  # (L, d)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.level_embed is not None:
            nn.init.normal_(self.level_embed)  # the papers' normal_(level_embed): N(0, 1)

    def forward(self, levels: Levels, masks=None, *, device=None, dtype=torch.float32) -> torch.Tensor | None:
        """Codes of the tokens of ``levels`` (``masks`` [(B, h_l, w_l)] True = padding, or None for an
        unpadded batch), or None when there is neither an encoding nor a level embedding.  # (B|1, N, d)"""
        if len(levels) != self.num_levels:
            raise ValueError(f"levels has {len(levels)} levels: expected num_levels={self.num_levels}")
        if masks is not None and len(masks) != len(levels):
            raise ValueError(f"masks has {len(masks)} entries: expected one per level ({len(levels)})")
        if self.pe is None and self.level_embed is None:
            return None
        if device is None:
            device = masks[0].device if masks is not None else \
                self.level_embed.device if self.level_embed is not None else None
        codes = []
        for l, shape in enumerate(levels.shapes):
            if self.pe is not None:
                code = self.pe(shape, None if masks is None else masks[l], device=device, dtype=dtype)  # (B|1, h*w, d)
            else:
                code = torch.zeros(1, shape[0] * shape[1], self.d_model, device=device, dtype=dtype)  # (1, h*w, d)
            if self.level_embed is not None:
                code = code + self.level_embed[l].to(dtype)  # (B|1, h*w, d)
            codes.append(code)
        B = max(c.shape[0] for c in codes)
        return torch.cat([c.expand(B, -1, -1) for c in codes], 1)  # (B|1, N, d)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_levels={self.num_levels}, level_pe={self.level_pe!r}"
