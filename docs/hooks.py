"""MkDocs hooks: what the site builds from, besides docs/ (issue 40).

- README.md is the landing page (``index.md``), so the README and the site's first page are one text.
- results/, configs/, notebooks/, bench/ and a few root files are mounted at their repository paths:
  the results pages (results/*.md, results/compare/*.md) are the site's results pages as they are,
  with their figures, and every link in them keeps working.
- Links are written as repository paths, so that they work on GitHub too (``../results/x.md`` from
  docs/, ``docs/encodings.md`` from README.md); the hook maps each one to the page it becomes.
- The registry tables (encodings, families, mask-awareness, options) are generated from the registry
  where a page writes ``<!-- vispe:table NAME -->`` (NAME: encodings, families, options).
- The API reference: one page per public module or package of vispe (mkdocstrings), listed in the nav.

The table functions import nothing from mkdocs, so tests call them directly.
"""
from __future__ import annotations

import inspect
import os
import posixpath
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOUNTED_DIRS = ("results", "configs", "notebooks", "bench")
MOUNTED_FILES = ("train.py", "bootstrap.py", "pyproject.toml", "requirements.lock", "CHANGELOG.md", "LICENSE")
SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints"}
TABLE_MARK = re.compile(r"^<!-- vispe:table (\w+) -->\n((?:\|.*\n?)*)", re.M)
DESCRIPTION = re.compile(r"^\| `(\w+)` \| (.*) \|$")
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


# ------------------------------------------------------------------ registry tables
def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(head, rows) -> str:
    return "\n".join([_row(head), "|" + "---|" * len(head), *(_row(r) for r in rows)])


def encodings_table(described: str = "") -> str:
    """name | family | mask-aware | what it is.

    Without ``described``: "what it is" is the class docstring's first line (``python -m vispe``).
    With it (the page's hand-written table ``| `name` | what it is |``, header included), that text,
    and every registered name must have a row and every row a registered name.
    """
    import vispe
    from vispe.__main__ import mask_awareness, table

    if not described.strip():
        return table()
    rows = [DESCRIPTION.match(line) for line in described.strip().splitlines()[2:]]
    if not all(rows):
        raise ValueError(f"encodings table: expected rows '| `name` | what it is |', got:\n{described}")
    text = {m.group(1): m.group(2) for m in rows}
    missing, unknown = sorted(set(vispe.available()) - set(text)), sorted(set(text) - set(vispe.available()))
    if missing or unknown:
        raise ValueError(f"encodings table: registered but not described: {missing}; described but not "
                         f"registered: {unknown}")
    cls = vispe.registry.get
    return _table(("name", "family", "mask-aware", "what it is"),
                  [(f"`{n}`", cls(n).family, mask_awareness(cls(n)), text[n]) for n in text])


def families_table() -> str:
    """family | base class (the contract) | registered encodings."""
    import vispe
    from vispe import encoding

    bases = {c.family: c for c in (encoding.AdditiveEncoding, encoding.RotaryEncoding, encoding.BiasEncoding,
                                   encoding.ConditionalEncoding)}
    families = sorted({vispe.family_of(n) for n in vispe.available()}, key=lambda f: (f not in bases, f))
    rows = []
    for fam in families:
        base = f"`vispe.encoding.{bases[fam].__name__}`" if fam in bases else "-"
        rows.append((fam, base, ", ".join(f"`{n}`" for n in vispe.available(fam))))
    return _table(("family", "base class", "encodings"), rows)


def _default(p: inspect.Parameter) -> str:
    if p.default is inspect.Parameter.empty:
        return f"`{p.name}` (required)"
    return f"`{p.name}={p.default!r}`".replace("|", "\\|")


def options_table() -> str:
    """name | constructor options with their defaults (``vispe.build(name, **options)``)."""
    import vispe

    rows = []
    for name in vispe.available():
        params = inspect.signature(vispe.registry.get(name).__init__).parameters.values()
        opts = [_default(p) for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        rows.append((f"`{name}`", ", ".join(opts) or "-"))
    return _table(("name", "options (defaults)"), rows)


TABLES = {"encodings": encodings_table, "families": families_table, "options": options_table}


def fill_tables(markdown: str, where: str = "") -> str:
    """Each ``<!-- vispe:table NAME -->`` line, with the hand-written table right below it if any
    (encodings only), replaced by the generated table."""

    def fill(m):
        name, below = m.group(1), m.group(2)
        if name not in TABLES:
            raise ValueError(f"{where}: unknown table {name!r}; known: {', '.join(TABLES)}")
        if below and name != "encodings":
            raise ValueError(f"{where}: the {name} table is generated whole; remove the table below its mark")
        out = TABLES[name](below) if below else TABLES[name]()
        return out + "\n"  # the mark's own line end, or the hand table's

    return TABLE_MARK.sub(fill, markdown)


# ------------------------------------------------------------------ API pages
def api_modules() -> dict[str, list[str]]:
    """{page name: modules on it}: one page per public top-level module and per package (its own
    public modules, not its subpackages'). Private modules (a part starting with _) are left out."""
    pages: dict[str, list[str]] = {}
    base = os.path.join(ROOT, "vispe")
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")) and
                             os.path.isfile(os.path.join(dirpath, d, "__init__.py")))
        pkg = os.path.relpath(dirpath, ROOT).replace(os.sep, ".")
        mods = [pkg] + [f"{pkg}.{f[:-3]}" for f in sorted(filenames) if f.endswith(".py") and not f.startswith("_")]
        if pkg == "vispe":  # top-level modules: a page each
            pages["vispe"] = ["vispe"]
            pages.update({m: [m] for m in mods[1:]})
        else:
            pages[pkg] = mods
    return dict(sorted(pages.items(), key=lambda kv: (kv[0] != "vispe", kv[0])))


def api_page(modules: list[str]) -> str:
    """The page's title is the module (or package); its docstring follows, then its submodules'."""
    first = f"::: {modules[0]}\n    options:\n      show_root_heading: false\n      show_root_toc_entry: false\n"
    return f"# `{modules[0]}`\n\n" + "\n".join([first, *(f"::: {m}\n" for m in modules[1:])])


# ------------------------------------------------------------------ links as repository paths
def site_path(repo_path: str) -> str | None:
    """Where a repository file is in the site (its src_uri), or None when it is not there."""
    if repo_path == "README.md":
        return "index.md"
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    if repo_path in MOUNTED_FILES or repo_path.split("/")[0] in MOUNTED_DIRS:
        return repo_path
    return None


def rewrite_links(markdown: str, repo_path: str, src_uri: str) -> str:
    """Links written relative to ``repo_path`` (the page's file in the repository), made relative
    to ``src_uri`` (the page in the site). Links inside fenced code blocks are left alone."""

    def one(m):
        target = m.group(2)
        if re.match(r"^(\w+:|#|/)", target):
            return m.group(0)
        path, sep, anchor = target.partition("#")
        repo = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path))
        site = site_path(repo)
        if site is None:
            return m.group(0)  # mkdocs reports it (strict: an error)
        rel = posixpath.relpath(site, posixpath.dirname(src_uri) or ".")
        return m.group(1) + rel + sep + anchor + m.group(3)

    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out.append(LINK.sub(one, markdown[last:fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(LINK.sub(one, markdown[last:]))
    return "".join(out)


# ------------------------------------------------------------------ mkdocs events
_REPO_PATH: dict[str, str] = {}


def on_config(config):
    """The nav's "API reference" entry lists the generated pages; "Results" the mounted pages."""
    for entry in config["nav"]:
        if isinstance(entry, dict) and "API reference" in entry:
            entry["API reference"] = [{name: f"api/{name}.md"} for name in api_modules()]
        if isinstance(entry, dict) and "Results" in entry:
            entry["Results"] = entry["Results"] + [
                {_title(p): p} for p in _mounted_pages() if p not in _nav_paths(entry["Results"])]
    return config


def _nav_paths(items) -> set[str]:
    out = set()
    for it in items:
        v = next(iter(it.values())) if isinstance(it, dict) else it
        out |= _nav_paths(v) if isinstance(v, list) else {v}
    return out


def _title(path: str) -> str:
    """A results page's title in the nav: its heading up to the first colon."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for line in f:
            if line.startswith("# "):
                return line[2:].split(":")[0].strip()
    return path


def _mounted(exts=None):
    for d in MOUNTED_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, d)):
            dirnames[:] = sorted(x for x in dirnames if x not in SKIP_PARTS)
            for f in sorted(filenames):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT).replace(os.sep, "/")
                if exts is None or rel.endswith(exts):
                    yield rel
    for f in MOUNTED_FILES:
        if os.path.isfile(os.path.join(ROOT, f)):
            yield f


def _mounted_pages():
    return [p for p in _mounted((".md",)) if p.startswith("results/")]


def on_files(files, config):
    from mkdocs.structure.files import File

    _SHOWN.clear()  # mkdocs serve rebuilds in one process
    for f in files:
        _REPO_PATH[f.src_uri] = "docs/" + f.src_uri
    files.append(File.generated(config, "index.md", abs_src_path=os.path.join(ROOT, "README.md")))
    _REPO_PATH["index.md"] = "README.md"
    for rel in _mounted():
        files.append(File.generated(config, rel, abs_src_path=os.path.join(ROOT, rel)))
        _REPO_PATH[rel] = rel
    for name, modules in api_modules().items():
        uri = f"api/{name}.md"
        files.append(File.generated(config, uri, content=api_page(modules)))
        _REPO_PATH[uri] = "docs/" + uri
    return files


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_SHOWN: set[str] = set()


def on_page_markdown(markdown, page, config, files):
    uri = page.file.src_uri
    markdown = fill_tables(markdown, uri)
    markdown = rewrite_links(markdown, _REPO_PATH.get(uri, "docs/" + uri), uri)
    base = posixpath.dirname(uri)
    _SHOWN.update(posixpath.normpath(posixpath.join(base, t)) for t in IMAGE.findall(markdown))
    return markdown


def on_env(env, config, files):
    """Every figure under results/ is shown on some page (a new one needs a place and a caption)."""
    from mkdocs.exceptions import PluginError

    unshown = sorted(p for p in _mounted((".png", ".svg", ".jpg")) if p.startswith("results/") and p not in _SHOWN)
    if unshown:
        raise PluginError(f"figures under results/ shown on no page (add them to docs/results.md): {unshown}")
    return env
