"""``python -m vispe``: the registered encodings, one line each (name, family, mask-aware, summary).

Mask-aware: "yes" (always), "no", or "option: <setting>" when a setting makes it so
(``PositionEncoding.mask_aware_option``).
"""
from __future__ import annotations

import inspect

from vispe.registry import available, get


def mask_awareness(cls) -> str:
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


if __name__ == "__main__":
    print(table())
