"""timm checkpoint compatibility of ``VispeViT`` with ``pe="learned_abs"`` (a mixin).

The ``learned_abs`` encoding holds its grid table as ``pe.pos_embed`` (1, h*w, C) and its prefix
vectors as ``pe.prefix_embed`` (1, P, C); timm holds one ``pos_embed`` (1, P + h*w, C), prefix
first. The state_dict is written under timm's key and read from it, so stock timm ViTs and vispe
ViTs load each other's checkpoints as they are. The grid the table was learned at is recorded in
the state_dict's ``_metadata["pe"]["table_grid"]`` (an extra key would break timm's strict
loading); it survives ``torch.save`` / ``torch.load`` but not a copy into a plain dict or
safetensors. Loading at another grid resamples by target size (``vispe.image.learned_abs``); a
state_dict without a record (timm's own) is read as timm does: the model's grid when the token
count matches, else a square grid; ``load_pos_embed(pos_embed, grid)`` names the grid explicitly.
"""
from __future__ import annotations

import torch

from vispe.encoding import GRID_KEY


class TimmPosEmbedKeys:
    """Mixin for VispeViT: learned_abs saved and loaded under timm's ``pos_embed`` key."""

    def _timm_keys(self) -> bool:
        return getattr(self, "pe_name", None) == "learned_abs"

    def state_dict(self, *args, **kwargs):
        """The state_dict; with ``learned_abs`` its table is saved under timm's key ``pos_embed``
        ((1, P + h*w, C), prefix vectors first), so stock timm ViTs load it as is; its grid goes to
        the metadata."""
        sd = super().state_dict(*args, **kwargs)
        if self._timm_keys():
            pre = kwargs.get("prefix", args[1] if len(args) > 1 else "")
            grid = sd.pop(pre + "pe.pos_embed")
            pfx = sd.pop(pre + "pe.prefix_embed", None)
            record = sd.pop(pre + "pe." + GRID_KEY)
            sd[pre + "pos_embed"] = grid if pfx is None else torch.cat([pfx, grid], dim=1)
            if hasattr(sd, "_metadata"):
                sd._metadata.setdefault(pre + "pe", {})[GRID_KEY] = tuple(record.tolist())
        return sd

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self._timm_keys() and prefix + "pos_embed" in state_dict:  # split; the encoding resamples
            table = state_dict.pop(prefix + "pos_embed")  # (1, P + n, C) or (1, n, C)
            P = self.pe.num_prefix_tokens
            state_dict[prefix + "pe.pos_embed"] = table[:, P:]
            if P:
                state_dict[prefix + "pe.prefix_embed"] = table[:, :P]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def load_pos_embed(self, pos_embed: torch.Tensor, grid: tuple[int, int]) -> None:
        """Load a timm ``pos_embed`` (1, P + h*w, C) learned for ``grid`` = (h, w) into ``learned_abs``."""
        if not self._timm_keys():
            raise ValueError(f"load_pos_embed needs pe='learned_abs': this model has pe={self.pe_name!r}")
        P = self.pe.num_prefix_tokens
        sd = {"pos_embed": pos_embed[:, P:], GRID_KEY: torch.tensor(tuple(grid))}
        if P:
            sd["prefix_embed"] = pos_embed[:, :P]
        self.pe.load_state_dict(sd)
