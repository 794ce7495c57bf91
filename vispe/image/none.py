"""No positional encoding: the baseline of every comparison (family "none").

``forward`` takes any arguments and returns ``None``; models skip the position step. Prefix
tokens (class, register) are NOT dropped: a model keeps them and they, like every token, get no
position (timm#2676 dropped them with ``pos_embed='none'``).
"""
from __future__ import annotations

from vispe import _checks
from vispe.encoding import PositionEncoding
from vispe.registry import register


@register("none")
class NoEncoding(PositionEncoding):
    """The absent encoding. ``dim`` (optional) is kept only so configs can pass it to any encoding."""

    family = "none"

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = None if dim is None else _checks.positive_int("dim", dim)

    def forward(self, *args, **kwargs) -> None:
        return None

    def prefix(self, *, device=None, dtype=None) -> None:
        """Prefix tokens get no position either."""
        return None

    def extra_repr(self) -> str:
        return f"family=none, dim={self.dim}"
