"""``vispe.audit(model)``: how any timm, transformers or vispe vision model encodes position, and
where that breaks, found by probing it as a black box (``vispe.audit.core``); ``vispe.audit.compare(a,
b)``: where two models' position handling differs; ``python -m vispe audit SPEC`` on the command line.

    report = vispe.audit(model)          # a Report: entries, findings, defects
    print(report.text())                 # or report.markdown()
"""
from __future__ import annotations

import sys
import types
from typing import Any

from vispe.audit.core import audit
from vispe.audit.report import Defect, Entry, Finding, Report

__all__ = ["audit", "compare", "Report", "Defect", "Entry", "Finding"]


def compare(a: Any, b: Any, **kwargs: Any) -> Any:
    """Where two models' position handling differs (``vispe.audit.compare_models.compare``)."""
    from vispe.audit.compare_models import compare as _compare

    return _compare(a, b, **kwargs)


class _CallableModule(types.ModuleType):
    """``vispe.audit`` is a package and a function: ``vispe.audit(model)`` is ``vispe.audit.audit(model)``."""

    def __call__(self, model: Any, *args: Any, **kwargs: Any) -> Report:
        return audit(model, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
