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


#: an example value of each argument a model passes to its encodings (for the error that names a missing one)
_EXAMPLES = {"dim": "256", "head_dim": "32", "num_heads": "8", "grid": "(14, 14)"}


def required_args(name: str) -> list[str]:
    """The arguments ``build(name, ...)`` cannot do without (the constructor's parameters without a
    default), e.g. ``["head_dim", "num_heads"]`` for ``rope_axial``. Inside a model (``create_vit``,
    ``create_detr``) the model passes them (``build_in``)."""
    params = inspect.signature(get(name)).parameters.values()
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


def build(name: str, **kwargs: Any) -> PositionEncoding:
    """Instantiate the encoding registered under ``name`` with ``kwargs`` (``required_args(name)``
    must be among them: a missing one is a ValueError saying what to pass)."""
    missing = [a for a in required_args(name) if a not in kwargs]
    if missing:
        raise ValueError(_missing_message(name, missing, kwargs))
    return _construct(name, kwargs)


def _missing_message(name: str, missing: list[str], kwargs: dict[str, Any]) -> str:
    need = required_args(name)
    values = {a: repr(kwargs[a]) if a in kwargs else _EXAMPLES.get(a, "...") for a in need}
    values.update({a: v for a, v in get(name).build_example.items() if a not in kwargs})
    note = ""
    if "head_dim" in missing and isinstance(kwargs.get("dim"), int):  # the model width is not the head's
        heads = kwargs.get("num_heads", 8)
        values["head_dim"] = str(kwargs["dim"] // heads) if isinstance(heads, int) and heads > 0 else "..."
        note = f" (head_dim is each head's channels: dim // num_heads; dim={kwargs['dim']!r} alone does not say it)"
    example = ", ".join(f"{a}={v}" for a, v in values.items())
    return (f"encoding {name!r} needs {' and '.join(missing)} (missing; it requires {', '.join(need)}){note}: "
            f"pass {'it' if len(missing) == 1 else 'them'}, e.g. vispe.build({name!r}, {example}); a model "
            "(create_vit, create_detr) passes them itself")


def _construct(name: str, kwargs: dict[str, Any]) -> PositionEncoding:
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
    # a missing argument is the model's to name (e.g. DETR's grid: train.py says detr.grid), so it
    # keeps Python's wording here, not build()'s advice on what to pass to vispe.build
    return _construct(name, {**ctx, **kwargs})


def available(family: str | None = None) -> list[str]:
    """Sorted names of the registered encodings, optionally of one family."""
    _load_builtin()
    return sorted(n for n, c in _REGISTRY.items() if family is None or c.family == family)


def family_of(name: str) -> str:
    return get(name).family
