"""Check that the text of an old README survives in the documentation (issue 40).

    python tools/readme_moved.py OLD_README.md       # e.g. git show <commit>:README.md > /tmp/old.md

Every sentence and every table cell of OLD (three words or more; Markdown markup, link targets and
line breaks ignored) must appear in README.md, a page of docs/ or the tables docs/hooks.py generates.
Prints what is missing and exits 1 if anything is. For the lead when text lands in the README of
another branch: move it to the page of its topic, then run this against that branch's README.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plain(md: str) -> str:
    """Markdown to comparable text: no code fences' backticks, emphasis, link targets or breaks."""
    md = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", md)  # [text](target) -> text
    md = re.sub(r"`+|\*\*|(?<!\w)\*(?!\s)|(?<!\s)\*(?!\w)", "", md)
    md = md.replace("\\|", "|")
    return re.sub(r"\s+", " ", md).strip()


def units(md: str) -> list[str]:
    """Sentences of paragraphs and list items, cells of tables, lines of code blocks (headings are
    structure, not facts: pages are titled by their topic)."""
    out = []
    for code in re.findall(r"^```\w*\n(.*?)^```", md, flags=re.S | re.M):
        out += [ln.strip() for ln in code.splitlines() if ln.strip()]
    md = re.sub(r"^```\w*\n.*?^```", "", md, flags=re.S | re.M)
    md = re.sub(r"^#+ .*$", "", md, flags=re.M)
    for block in re.split(r"\n\s*\n", md):
        lines = block.splitlines()
        if lines and all(ln.lstrip().startswith("|") for ln in lines):
            for ln in lines:
                if not re.fullmatch(r"\|?[-| :]+\|?", ln.strip()):
                    out += [c for c in re.split(r"(?<!\\)\|", ln) if c.strip()]
            continue
        text = " ".join(ln.lstrip("#-* ").strip() if ln.lstrip().startswith(("#", "- ", "* ")) else ln
                        for ln in lines)
        out += re.split(r"(?<=[.;])\s+(?=[A-Z`(*\[])", text)
    return [plain(u) for u in out if len(plain(u).split()) >= 3]


def corpus() -> str:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return plain("\n".join(hooks.fill_tables(p.read_text()) for p in pages))


def main(argv: list[str]) -> int:
    old = Path(argv[0]).read_text()
    text = corpus()
    missing = [u for u in units(old) if u not in text]
    for u in missing:
        print("missing:", u)
    print(f"{len(units(old)) - len(missing)} of {len(units(old))} sentences and cells found")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
