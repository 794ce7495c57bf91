"""``python -m vispe audit SPEC [key=value ...] [--size HxW ...] [--markdown]``: audit a model, print
the report, exit 1 when it has a defect (0 when none; 2 on a bad spec), so CI can run it.

SPEC is a timm model name (``vit_small_patch16_224``: random weights, ``key=value`` passed to
``timm.create_model``), a transformers class name (``DINOv3ViTModel``: built from its config class
with ``key=value`` overrides, random weights) or ``module:factory`` (``key=value`` passed to the
factory). Values are Python literals (``num_hidden_layers=2``, ``image_size=56``), else strings.
"""
from __future__ import annotations

import argparse
import ast
import importlib
from collections.abc import Sequence
from typing import Any

from torch import nn


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def overrides(items: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"override {item!r}: expected key=value")
        out[key] = _value(value)
    return out


def build(spec: str, kwargs: dict[str, Any]) -> nn.Module:
    """The model a SPEC names, with random weights (module docstring)."""
    if ":" in spec:
        mod, _, fn = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"SPEC={spec!r}: no factory {fn!r} in module {mod!r} ({e})") from e
        return factory(**kwargs)
    import timm

    if timm.is_model(spec):
        return timm.create_model(spec, pretrained=False, **kwargs)
    import transformers

    cls: Any = getattr(transformers, spec, None)
    if isinstance(cls, type) and getattr(cls, "config_class", None) is not None:
        return cls(cls.config_class(**kwargs))  # type: ignore[attr-defined]
    raise ValueError(f"SPEC={spec!r}: expected a timm model name, a transformers model class name "
                     "(e.g. DINOv3ViTModel) or module:factory")


def _size(text: str) -> tuple[int, int]:
    h, sep, w = text.lower().partition("x")
    if not sep or not h.isdigit() or not w.isdigit():
        raise argparse.ArgumentTypeError(f"--size {text!r}: expected HxW in pixels, e.g. 224x320")
    return int(h), int(w)


def main(argv: Sequence[str]) -> int:
    from vispe.audit.core import audit

    p = argparse.ArgumentParser(prog="python -m vispe audit", description=__doc__.split("\n\n")[0])
    p.add_argument("spec", help="timm name, transformers class name, or module:factory")
    p.add_argument("overrides", nargs="*", help="key=value passed to the model's constructor / config")
    p.add_argument("--size", type=_size, action="append", help="HxW pixels to run at (repeat; default: five sizes)")
    p.add_argument("--markdown", action="store_true", help="print the report as Markdown")
    args = p.parse_args(list(argv))
    try:
        model = build(args.spec, overrides(args.overrides))
    except ValueError as e:
        p.print_usage()
        print(f"python -m vispe audit: error: {e}")
        return 2
    report = audit(model, sizes=args.size, name=args.spec)
    print(report.markdown() if args.markdown else report.text())
    return 1 if report.defects else 0
