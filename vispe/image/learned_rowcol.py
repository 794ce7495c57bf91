"""DETR's learned row and column tables (Carion et al., 2020, ``PositionEmbeddingLearned``).

Two learned 1D tables, ``R`` (rows, max_size[0] x dim/2) and ``C`` (columns, max_size[1] x dim/2)::

    PE(y, x) = [ R[y] , C[x] ]        axis_order="yx" (default): y channels FIRST     # (dim,)
    PE(y, x) = [ C[x] , R[y] ]        axis_order="xy": DETR's ``PositionEmbeddingLearned`` and
                                      transformers' ``DetrLearnedPositionEmbedding``

DETR's own learned module concatenates x first while its sine puts y first; vispe puts y first in
both by default, and ``axis_order="xy"`` reproduces DETR. Tokens at (y, x) = divmod(i, w).

Checkpoints: the tables are saved as ``row.weight`` (y) and ``col.weight`` (x). DETR's keys
``row_embed.weight`` / ``col_embed.weight`` and transformers' ``row_embeddings.weight`` /
``column_embeddings.weight`` are read by ``load_state_dict`` directly (a ``_load_from_state_dict``
hook renames them; the module must have ``axis_order="xy"``, as those tables are applied x first),
and ``convert_detr_state_dict`` renames them in a whole checkpoint. Initialisation ``init``:
"uniform" U(0, 1) (DETR's ``reset_parameters``, and transformers' ``_init_weights`` in a
``DetrModel``), "normal" N(0, 1) (``nn.Embedding``'s default: transformers'
``DetrLearnedPositionEmbedding`` built on its own), "trunc_normal" (std 0.02).

Grid change: a grid within ``max_size`` reads the first h rows / w columns (DETR). Past it, DETR
hits a device-side assert (detr#76); here ``overflow="interpolate"`` resamples the whole 1D table
to the needed length by target size (``vispe.axis.learned.resize_table_1d``, ``resize_mode``), and
``overflow="error"`` raises a ValueError. ``resize_((h, w))`` does at load time what ``forward``
does at run time: a table shorter than the grid is resampled to it (``max_size`` grows), a longer
one is kept, so the code at (h, w) does not change (rebuild optimizers after it). Loading a
state_dict of another ``max_size`` (``vispe.encoding``): a longer table keeps its first rows, a
shorter one is resampled (``overflow="interpolate"``) or refused (``"error"``).

Padding mask: not mask-aware (positions are grid indices), but with DETR's bottom/right padding
the indices on an image's valid area do not depend on the padding. Output ``(B|1, h*w, dim)``.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks, _tracing
from vispe.axis.learned import LearnedTable1d
from vispe.image._additive import AdditiveBase, fit_axis_tables, float32_math
from vispe.registry import register

INITS = ("uniform", "normal", "trunc_normal")
AXIS_ORDERS = ("yx", "xy")
#: checkpoint key (suffix) of DETR / transformers -> vispe's
DETR_KEYS = {"row_embed.weight": "row.weight", "col_embed.weight": "col.weight",
             "row_embeddings.weight": "row.weight", "column_embeddings.weight": "col.weight"}


def convert_detr_state_dict(state_dict: dict) -> dict:
    """A copy of ``state_dict`` with DETR's / transformers' learned row-column keys renamed to
    vispe's (``...row_embed.weight`` -> ``...row.weight``, ``...column_embeddings.weight`` ->
    ``...col.weight``, whatever their prefix); other keys are kept as they are."""
    out = {}
    for key, value in state_dict.items():
        for old, new in DETR_KEYS.items():
            if key == old or key.endswith("." + old):
                key = key[: len(key) - len(old)] + new
                break
        out[key] = value
    return out


@register("learned_rowcol")
class LearnedRowColEncoding(AdditiveBase):
    """Learned row / column tables of ``dim/2`` channels each (y first; ``axis_order="xy"``: DETR).

    Args:
        dim: channels, even.
        max_size: (rows, columns) the tables hold (DETR: 50 x 50).
        overflow: "interpolate" or "error" past ``max_size``.
        resize_mode: 1D resampling past ``max_size``: "linear" (default), "bicubic" or "nearest".
        init: "uniform" (DETR's ``nn.init.uniform_``, U(0, 1)), "normal" (N(0, 1), ``nn.Embedding``'s
            default) or "trunc_normal" (std 0.02).
        axis_order: "yx" (default, y channels first) or "xy" (DETR / transformers: x first).
        num_prefix_tokens: learned prefix vectors returned by ``prefix()`` (0: none).
    """

    def __init__(self, dim: int, *, max_size=(50, 50), overflow: str = "interpolate",
                 resize_mode: str = "linear", init: str = "uniform", axis_order: str = "yx",
                 num_prefix_tokens: int = 0) -> None:
        _checks.divisible("dim", dim, 2, "dim/2 channels per axis")
        super().__init__(dim, num_prefix_tokens)
        rows, cols = _checks.grid_shape("max_size", max_size)
        _checks.choice("init", init, INITS)
        self.init = init
        self.axis_order = _checks.choice("axis_order", axis_order, AXIS_ORDERS)
        self.row = LearnedTable1d(rows, dim // 2, overflow=overflow, resize_mode=resize_mode)  # y table
        self.col = LearnedTable1d(cols, dim // 2, overflow=overflow, resize_mode=resize_mode)  # x table
        for table in (self.row, self.col):
            if init == "uniform":
                nn.init.uniform_(table.weight)
            elif init == "normal":
                nn.init.normal_(table.weight)
            else:
                nn.init.trunc_normal_(table.weight, std=0.02)

    @property
    def max_size(self) -> tuple[int, int]:
        return self.row.length, self.col.length

    def forward(self, shape, mask=None, *, device=None, dtype=None) -> torch.Tensor:  # (B|1, h*w, dim)
        (h, w), mask, device, dtype = self._inputs(shape, mask, device, dtype, self.row.weight.dtype)
        with float32_math(device):
            ey = _axis_table(self.row, h, "rows", device)  # (h, dim/2)
            ex = _axis_table(self.col, w, "columns", device)  # (w, dim/2)
            parts = [ey[:, None].expand(h, w, -1), ex[None].expand(h, w, -1)]  # (h, w, dim/2) each
            if self.axis_order == "xy":
                parts.reverse()
            table = torch.cat(parts, dim=-1)  # (h, w, dim)
        return self._output(table.reshape(1, h * w, self.dim), mask, dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Read DETR's / transformers' keys (``row_embed.weight``, ``column_embeddings.weight``...)."""
        for old, new in DETR_KEYS.items():
            if prefix + old in state_dict:
                if self.axis_order != "xy":
                    raise ValueError(f"{prefix + old}: a DETR / transformers learned table, applied x first; "
                                     "build learned_rowcol with axis_order='xy' to reproduce it")
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def resize_(self, shape) -> LearnedRowColEncoding:
        """Make the tables cover grid ``shape`` = (h, w) at load time, as ``forward`` does at run time.

        A table shorter than the grid is resampled to the grid's length (``max_size`` grows); a
        longer one is kept (the grid reads its first entries), so the code at ``shape`` is unchanged.
        """
        h, w = _checks.grid_shape("shape", shape)
        for table, n in ((self.row, h), (self.col, w)):
            if n > table.length:
                table.resize_(n)
        self._cache.clear()
        return self

    def table_grid(self):
        return self.max_size

    def infer_grid(self, state_dict, prefix):
        r, c = state_dict.get(prefix + "row.weight"), state_dict.get(prefix + "col.weight")
        return None if r is None or c is None else (r.shape[0], c.shape[0])

    def load_grid_(self, state_dict, prefix, saved) -> None:  # first rows, or resampled past them
        fit_axis_tables(state_dict, prefix, saved, {"row.weight": self.row, "col.weight": self.col}, keep_first=True)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, max_size={self.max_size}, axis_order={self.axis_order!r}, overflow={self.row.overflow!r}, "
                f"resize_mode={self.row.resize_mode!r}, num_prefix_tokens={self.num_prefix_tokens}")


def _axis_table(table: LearnedTable1d, n: int, what: str, device) -> torch.Tensor:
    """The first n entries of ``table`` when it holds them (DETR), else the table resampled to n.

    ``n`` may be symbolic (torch.export): then no branch on it is recorded; the table resampled
    to max(n, length) (itself when n <= length) and cut to n is the same rule.
    """
    if _tracing.known(n <= table.length):
        return table.weight[:n].to(device)  # (n, C)
    if table.overflow == "error":
        _tracing.check(n <= table.length, f"shape has {n} {what}: the learned table holds {table.length} "
                       "(max_size) and overflow='error'; use overflow='interpolate' or a larger max_size")
        return table.weight[:n].to(device)  # (n, C)
    return table.table(torch.sym_max(n, table.length))[:n].to(device)  # (n, C), resampled by target size

