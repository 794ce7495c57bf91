"""``python -m vispe``: the registered encodings, one line each (name, family, mask-aware, summary)."""
from __future__ import annotations

import inspect

from vispe.registry import available, get


def table() -> str:
    rows = [("name", "family", "mask-aware", "what it is")]
    for name in available():
        cls = get(name)
        doc = inspect.getdoc(cls) or inspect.getdoc(inspect.getmodule(cls)) or ""
        rows.append((name, cls.family, "yes" if cls.mask_aware else "no", doc.split("\n")[0]))
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
