"""timm checkpoint compatibility of ``VispeViT`` with ``pe="learned_abs"`` (a mixin).

The ``learned_abs`` encoding holds its grid table as ``pe.pos_embed`` (1, h*w, C) and its prefix
vectors as ``pe.prefix_embed`` (1, P, C); timm holds one ``pos_embed`` (1, P + h*w, C), prefix
first. The state_dict is written under timm's key and read from it (resampled by target size when
the grid differs), so stock timm ViTs and vispe ViTs load each other's checkpoints as they are.
"""
from __future__ import annotations

import torch

from vispe.image.learned_abs import resample_grid_table


class TimmPosEmbedKeys:
    """Mixin for VispeViT: learned_abs saved and loaded under timm's ``pos_embed`` key."""

    def _timm_keys(self) -> bool:
        return getattr(self, "pe_name", None) == "learned_abs"

    def state_dict(self, *args, **kwargs):
        """The state_dict; with ``learned_abs`` its table is saved under timm's key ``pos_embed``
        ((1, P + h*w, C), prefix vectors first), so stock timm ViTs load it as is."""
        sd = super().state_dict(*args, **kwargs)
        if self._timm_keys():
            pre = kwargs.get("prefix", args[1] if len(args) > 1 else "")
            grid = sd.pop(pre + "pe.pos_embed")
            pfx = sd.pop(pre + "pe.prefix_embed", None)
            sd[pre + "pos_embed"] = grid if pfx is None else torch.cat([pfx, grid], dim=1)
        return sd

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self._timm_keys() and prefix + "pos_embed" in state_dict:
            self._split_pos_embed(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _split_pos_embed(self, state_dict: dict, prefix: str) -> None:
        table = state_dict.pop(prefix + "pos_embed")  # (1, P + n, C) or (1, n, C)
        P = self.pe.num_prefix_tokens
        n = table.shape[1] - P
        old = self.pe.grid if n == self.pe.grid[0] * self.pe.grid[1] else _square_grid(n)
        pfx, grid = table[:, :P], table[:, P:]
        if old != self.pe.grid:
            grid = resample_grid_table(grid, old, self.pe.grid, interpolation=self.pe.interpolation,
                                       antialias=self.pe.antialias)
        state_dict[prefix + "pe.pos_embed"] = grid
        if P:
            state_dict[prefix + "pe.prefix_embed"] = pfx

    def load_pos_embed(self, pos_embed: torch.Tensor, grid: tuple[int, int]) -> None:
        """Load a timm ``pos_embed`` learned for ``grid`` into the ``learned_abs`` encoding."""
        if not self._timm_keys():
            raise ValueError(f"load_pos_embed needs pe='learned_abs': this model has pe={self.pe_name!r}")
        sd = {"pos_embed": pos_embed}
        P = self.pe.num_prefix_tokens
        if tuple(grid) != self.pe.grid:
            sd = {"pos_embed": torch.cat([pos_embed[:, :P], _resample_to(self, pos_embed[:, P:], grid)], 1)}
        self._split_pos_embed(sd, "")
        with torch.no_grad():
            self.pe.pos_embed.copy_(sd["pe.pos_embed"])
            if P:
                self.pe.prefix_embed.copy_(sd["pe.prefix_embed"])


def _square_grid(n: int) -> tuple[int, int]:
    side = int(round(n ** 0.5))
    if side * side != n:
        raise ValueError(f"pos_embed has {n} grid positions, not a square: load it with "
                         "load_pos_embed(pos_embed, grid=(h, w)) naming its grid")
    return side, side


def _resample_to(model, grid_table: torch.Tensor, old: tuple[int, int]) -> torch.Tensor:
    return resample_grid_table(grid_table, tuple(old), model.pe.grid, interpolation=model.pe.interpolation,
                               antialias=model.pe.antialias)
