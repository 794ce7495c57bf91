"""One registry for every encoding: ``register`` / ``build`` / ``available``.

A new encoding is one file plus one line: ``@register("name")`` on its class.
"""
from __future__ import annotations

import difflib

_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator adding an encoding under ``name``; a duplicate name is an error."""

    def deco(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"encoding name {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        _REGISTRY[name] = cls
        cls.registry_name = name
        return cls

    return deco


def _load_builtin() -> None:
    # Importing the image package registers every built-in encoding.
    import vispe.image  # noqa: F401


def get(name: str) -> type:
    """The class registered under ``name``; an unknown name lists the known ones."""
    _load_builtin()
    if name not in _REGISTRY:
        near = difflib.get_close_matches(str(name), list(_REGISTRY), n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ValueError(f"unknown encoding {name!r}{hint}; known encodings: {', '.join(available())}")
    return _REGISTRY[name]


def build(name: str, **kwargs):
    """Instantiate the encoding registered under ``name`` with ``kwargs``."""
    return get(name)(**kwargs)


def available(family: str | None = None) -> list[str]:
    """Sorted names of the registered encodings, optionally of one family."""
    _load_builtin()
    return sorted(n for n, c in _REGISTRY.items() if family is None or c.family == family)


def family_of(name: str) -> str:
    return get(name).family
