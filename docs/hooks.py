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
            listed = _nav_paths(entry["Results"])
            entry["Results"] = entry["Results"] + results_nav([p for p in _mounted_pages() if p not in listed])
    return config


def _nav_paths(items) -> set[str]:
    out = set()
    for it in items:
        v = next(iter(it.values())) if isinstance(it, dict) else it
        out |= _nav_paths(v) if isinstance(v, list) else {v}
    return out


# ------------------------------------------------------------------ the Results navigation
RESULT_GROUPS = ("Comparisons", "Reproducibility and checks", "Benchmarks", "Parity with the originals")
RESULT_PAGES = {  # page: (group, title in the nav: what the page shows), in the order the nav lists them
    "results/compare/embedded_tasks.md": ("Comparisons", "Every encoding on the four digit tasks"),
    "results/compare/resolution_transfer.md": ("Comparisons", "Resolution transfer (RoPE-ViT's experiment)"),
    "results/compare/extrapolation.md": ("Comparisons", "Extrapolation: LieRE, ComRoPE, STRING, LookHere"),
    "results/compare/rope_scaling.md": ("Comparisons", "RoPE scaling at evaluation, centred sin-cos codes"),
    "results/compare/constant_offset.md": ("Comparisons", "The constant part of fixed sin-cos codes"),
    "results/compare/cpvt_padding.md": ("Comparisons", "CPVT's PEG with and without zero padding"),
    "results/padding_leakage.md": ("Comparisons", "Padding leakage in frozen CNNs and ViTs"),
    "results/compare/padding_leakage_vs_papers.md": ("Comparisons", "Padding leakage beside Islam et al. and Kayhan"),
    "results/compare/detr_table3.md": ("Comparisons", "DETR Table 3: position in the detector"),
    "results/compare/detr_deformable.md": ("Comparisons", "Multi-scale Deformable DETR designs"),
    "results/compare/detr_backbones.md": ("Comparisons", "Detector backbones: small CNN against a ViT"),
    "results/compare/cifar10_grid.md": ("Comparisons", "CIFAR-10 grid (ready, not run)"),
    "results/compare/reproducibility.md": ("Reproducibility and checks", "What a repeated run gives"),
    "results/compare/rerun_today.md": ("Reproducibility and checks", "The digit grids rerun at today's code"),
    "results/compare/same_numbers.md": ("Reproducibility and checks", "Smoke runs at a CSV's commit and at HEAD"),
    "results/default_run.md": ("Reproducibility and checks", "The default train.py run, measured"),
    "results/mutants.md": ("Reproducibility and checks", "Planted bugs and the tests that catch them"),
    "results/bench_vit_step.md": ("Benchmarks", "ViT step time per encoding"),
    "results/bench_vit_vs_timm.md": ("Benchmarks", "ViT step: vispe against timm"),
    "results/bench_scaling.md": ("Benchmarks", "Cost of position from 64 to 4,096 tokens"),
    "results/bench_rope_share.md": ("Benchmarks", "RoPE's share of one attention call"),
    "results/bench_rope_blocks.md": ("Benchmarks", "Block-rotation and direction encodings"),
    "results/bench_bias_attention.md": ("Benchmarks", "Relative bias: time and memory"),
    "results/bench_compile.md": ("Benchmarks", "torch.compile against eager"),
    "results/bench_threads.md": ("Benchmarks", "Training step per thread setting"),
    "results/bench_detr_default.md": ("Benchmarks", "The detection default in five minutes"),
    "results/bench_detr_step.md": ("Benchmarks", "DETR step against transformers"),
    "results/bench_detr_positioned.md": ("Benchmarks", "Conditional and DAB-DETR step against transformers"),
    "results/bench_deformable_step.md": ("Benchmarks", "Deformable layers against transformers"),
    "results/bench_deformable_detector.md": ("Benchmarks", "Deformable DETR against transformers"),
    "results/bench_dino_step.md": ("Benchmarks", "DINO's step against two-stage Deformable DETR"),
    "results/bench_towers_segmentation.md": ("Benchmarks", "Segmentation towers against transformers"),
    "results/compare/parity_towers.md": ("Parity with the originals", "Converted vision towers"),
    "results/compare/parity_dinov3_naflex.md": ("Parity with the originals", "DINOv3 and NaFlex conversions"),
    "results/compare/parity_official_detr.md": ("Parity with the originals", "load_detr against the papers' code"),
}
NUMBERED = re.compile(r"^(?:Item|Issue|Part) \d+\s*:\s*|\s*\((?:issue|item)s? [^)]*\)$", re.I)


def result_place(path: str) -> tuple[str, str]:
    """(group, title) of a results page: RESULT_PAGES' entry, else by its name (``bench_*``: Benchmarks,
    ``parity_*``: Parity, the rest: Comparisons) with its heading as the title, without an "Item N:" /
    "Issue N:" prefix, an "(issue N)" suffix or backticks."""
    if path in RESULT_PAGES:
        return RESULT_PAGES[path]
    name = posixpath.basename(path)
    group = ("Benchmarks" if name.startswith("bench_") else "Parity with the originals" if name.startswith("parity_")
             else "Comparisons")
    return group, _title(path)


def results_nav(paths) -> list[dict]:
    """The Results navigation's groups: [{group: [{title: page}, ...]}, ...], pages in RESULT_PAGES' order, then
    the others by path."""
    order = {p: i for i, p in enumerate(RESULT_PAGES)}
    groups: dict[str, list[dict]] = {g: [] for g in RESULT_GROUPS}
    for p in sorted(paths, key=lambda p: (order.get(p, len(order)), p)):
        group, title = result_place(p)
        groups[group].append({title: p})
    return [{g: items} for g, items in groups.items() if items]


def _title(path: str) -> str:
    """A results page's heading as a nav title: no "Item N:" prefix, "(issue N)" suffix or backticks."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        for line in f:
            if line.startswith("# "):
                title = NUMBERED.sub("", line[2:].strip()).replace("`", "").strip()
                return title[:1].upper() + title[1:]
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


TABLE_HTML = re.compile(r"<table>.*?</table>", re.S)
CODE_HTML = re.compile(r"<code>([^<]*)</code>")


def keep_tokens(html: str) -> str:
    """Inline code inside tables with each of its space-separated tokens in ``<span class="vispe-token">`` (kept on
    one line by docs/stylesheets/extra.css): a command in a table cell wraps at its spaces, never inside a token."""

    def code(m):
        parts = re.split(r"(\s+)", m.group(1))
        return "<code>" + "".join(p if not p or p.isspace() else f'<span class="vispe-token">{p}</span>'
                                  for p in parts) + "</code>"

    return TABLE_HTML.sub(lambda t: CODE_HTML.sub(code, t.group(0)), html)


def on_page_content(html, page, config, files):
    return keep_tokens(html)


def on_env(env, config, files):
    """Every figure under results/ is shown on some page (a new one needs a place and a caption)."""
    from mkdocs.exceptions import PluginError

    unshown = sorted(p for p in _mounted((".png", ".svg", ".jpg")) if p.startswith("results/") and p not in _SHOWN)
    if unshown:
        raise PluginError(f"figures under results/ shown on no page (add them to docs/results.md): {unshown}")
    return env
