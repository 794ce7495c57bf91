"""One registry for every encoding: ``register`` / ``build`` / ``available``.

A new encoding is one file plus one line: ``@register("name")`` on its class.
"""
from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # for the annotations only: encodings import the registry, not the other way round
    from vispe.encoding import PositionEncoding

E = TypeVar("E", bound="type[PositionEncoding]")
_REGISTRY: dict[str, type[PositionEncoding]] = {}


def register(name: str) -> Callable[[E], E]:
    """Class decorator adding an encoding under ``name``; a duplicate name is an error."""

    def deco(cls: E) -> E:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"encoding name {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        _REGISTRY[name] = cls
        cls.registry_name = name
        return cls

    return deco


def _load_builtin() -> None:
    # Importing the image package registers every built-in encoding.
    import vispe.image  # noqa: F401


def get(name: str) -> type[PositionEncoding]:
    """The class registered under ``name``; an unknown name lists the known ones."""
    _load_builtin()
    if name not in _REGISTRY:
        near = suggest(name)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ValueError(f"unknown encoding {name!r}{hint}; known encodings: {', '.join(available())}")
    return _REGISTRY[name]


def suggest(name: str, n: int = 4) -> list[str]:
    """Registered names near ``name``: those it starts or is a part of ("rope" -> rope_axial,
    rope_mixed), then the closest spellings ("sinee" -> sine)."""
    _load_builtin()
    name = str(name).lower()
    parts = [k for k in available() if name and (k.startswith(name) or name in k.split("_"))]
    close = difflib.get_close_matches(name, available(), n=n)
    return list(dict.fromkeys(parts + close))[:n]


def build(name: str, **kwargs: Any) -> PositionEncoding:
    """Instantiate the encoding registered under ``name`` with ``kwargs``."""
    cls = get(name)
    try:
        return cls(**kwargs)
    except TypeError as e:  # an unknown keyword: say which encoding and what it takes
        params = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        raise ValueError(f"encoding {name!r}: {e}; it takes: {', '.join(params)}") from e


def build_in(name: str, context: dict[str, Any], **kwargs: Any) -> PositionEncoding:
    """Build ``name`` for a model: ``context`` (dim, num_heads, head_dim, grid, num_prefix_tokens...)
    is passed only where the encoding's constructor takes that argument; ``kwargs`` always are
    (user settings, never dropped) and override the context.
    """
    params = inspect.signature(get(name)).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    ctx = {k: v for k, v in context.items() if takes_all or k in params}
    return build(name, **{**ctx, **kwargs})


def available(family: str | None = None) -> list[str]:
    """Sorted names of the registered encodings, optionally of one family."""
    _load_builtin()
    return sorted(n for n, c in _REGISTRY.items() if family is None or c.family == family)


def family_of(name: str) -> str:
    return get(name).family
