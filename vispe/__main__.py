"""``python -m vispe``: the registered encodings, one line each (name, family, mask-aware, the
arguments ``vispe.build`` requires, summary).

``python -m vispe explain [options]``: which attention kernel each layer of a ViT ran
(``vispe.models.explain_cli``; ``python -m vispe explain -h`` lists the options).

``python -m vispe audit SPEC``: how a timm, transformers or ``module:factory`` model encodes position
and where that breaks (``vispe.audit.cli``); exit status 1 when the report has a defect.

Mask-aware: "yes" (always), "no", or "option: <setting>" when a setting makes it so
(``PositionEncoding.mask_aware_option``). Required arguments: what ``vispe.build(name, ...)`` cannot
do without (``vispe.registry.required_args``); a model (``create_vit``, ``create_detr``) passes them.
"""
from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Sequence

from vispe.encoding import PositionEncoding
from vispe.registry import available, get, required_args

USAGE = """usage: python -m vispe            the registered encodings (a Markdown table)
       python -m vispe explain -h (which attention kernel each layer of a ViT ran)
       python -m vispe audit -h   (how a timm / transformers model encodes position; exit 1 on a defect)
       python -m vispe -h         this help

Required arguments are those vispe.build(name, ...) needs, e.g.
vispe.build("rope_axial", head_dim=32, num_heads=8); a model (create_vit, create_detr) passes them."""


def mask_awareness(cls: type[PositionEncoding]) -> str:
    if cls.mask_aware:
        return "yes"
    return f"option: {cls.mask_aware_option}" if cls.mask_aware_option else "no"


def summary(doc: str) -> str:
    """The first line of a docstring as Markdown: reST ````code```` as ```code```, no pointer to the
    module docstring (the listing is read in a terminal or pasted into Markdown)."""
    line = re.sub(r"``(.+?)``", r"`\1`", doc.split("\n")[0])
    line = re.sub(r"\s*\((see )?the module docstring\)|\s*\(module docstring\)", "", line)
    return line.replace("|", "\\|")


def table() -> str:
    rows = [("name", "family", "mask-aware", "required arguments", "what it is")]
    for name in available():
        cls = get(name)
        doc = inspect.getdoc(cls) or inspect.getdoc(inspect.getmodule(cls)) or ""
        rows.append((name, cls.family, mask_awareness(cls), ", ".join(required_args(name)) or "-", summary(doc)))
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["explain"]:
        from vispe.models.explain_cli import main as explain_main

        return explain_main(argv[1:])
    if argv[:1] == ["audit"]:
        from vispe.audit.cli import main as audit_main

        return audit_main(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if argv:
        print(f"{USAGE}\npython -m vispe: error: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
