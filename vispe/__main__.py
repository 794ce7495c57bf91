"""``python -m vispe``: the registered encodings, one line each (name, family, mask-aware, summary).

``python -m vispe explain [options]``: which attention kernel each layer of a ViT ran
(``vispe.models.explain_cli``; ``python -m vispe explain -h`` lists the options).

Mask-aware: "yes" (always), "no", or "option: <setting>" when a setting makes it so
(``PositionEncoding.mask_aware_option``).
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence

from vispe.encoding import PositionEncoding
from vispe.registry import available, get


def mask_awareness(cls: type[PositionEncoding]) -> str:
    if cls.mask_aware:
        return "yes"
    return f"option: {cls.mask_aware_option}" if cls.mask_aware_option else "no"


def table() -> str:
    rows = [("name", "family", "mask-aware", "what it is")]
    for name in available():
        cls = get(name)
        doc = inspect.getdoc(cls) or inspect.getdoc(inspect.getmodule(cls)) or ""
        rows.append((name, cls.family, mask_awareness(cls), doc.split("\n")[0]))
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["explain"]:
        from vispe.models.explain_cli import main as explain_main

        return explain_main(argv[1:])
    if argv:
        print(f"usage: python -m vispe            (the registered encodings)\n"
              f"       python -m vispe explain -h (which attention kernel each layer ran)\n"
              f"python -m vispe: error: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
