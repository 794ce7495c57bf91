"""Vision towers of multimodal models (and segmenters) converted to vispe: one file per family.

``vispe.models.vit.convert_vit(model)`` asks ``converter_for(model)`` once, before its timm kinds;
a tower family adds itself with one decorator on its converter, keyed by the library and the
exact class name of the original (no import of that library here, so vispe runs without it):

    @register_tower("transformers", "PixtralVisionModel")
    def convert_pixtral(model, pe=None, *, pe_kwargs=None, pe_at="input", peg_blocks=(0,),
                        keep_abs_pos=None): ...

Every converter takes those five arguments (``convert_vit`` passes them all) and refuses, with a
ValueError naming the argument, the ones that do not apply to its tower; it returns a new vispe
model holding the original's weights (the original is left untouched) that is called with the
original's arguments and returns what the original returns. What it cannot convert faithfully it
refuses, naming the part.
"""
from __future__ import annotations

from collections.abc import Callable

_CONVERTERS: dict[tuple[str, str], Callable] = {}


def register_tower(library: str, class_name: str):
    """Decorator: ``fn`` converts models whose class is ``class_name`` from ``library`` (the first
    part of the class's module, e.g. "transformers", "timm"); a second converter for one class is an error."""

    def deco(fn: Callable) -> Callable:
        key = (library, class_name)
        if key in _CONVERTERS and _CONVERTERS[key] is not fn:
            raise ValueError(f"a converter for {library}'s {class_name} is already registered "
                             f"({_CONVERTERS[key].__qualname__})")
        _CONVERTERS[key] = fn
        return fn

    return deco


def converter_for(model) -> Callable | None:
    """The registered converter of ``model``'s exact class (subclasses are not matched), or None."""
    cls = type(model)
    return _CONVERTERS.get((cls.__module__.split(".")[0], cls.__name__))


def convertible() -> list[str]:
    """``"library.ClassName"`` of every registered tower, sorted."""
    return sorted(f"{lib}.{name}" for lib, name in _CONVERTERS)


# Each family registers its converter on import (none imports its original library at module level):
# one import line per family file below.
from vispe.models.towers import (
    eomt,  # noqa: E402,F401
    idefics3,  # noqa: E402,F401
    llama4,  # noqa: E402,F401
    pixtral,  # noqa: E402,F401
    qwen_vl,  # noqa: E402,F401
    sam,  # noqa: E402,F401
    sam2_hiera,  # noqa: E402,F401
    sam3,  # noqa: E402,F401
    siglip2,  # noqa: E402,F401
)
