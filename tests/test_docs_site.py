"""The documentation site (issue 40): registry tables generated from the registry, links written as
repository paths mapped to the site, and the built site opened in a real browser (headless
Chromium from Debian's packages, driven by selenium through Debian's chromedriver).

The site is the one `.ci/run` builds with `mkdocs build --strict` (``VISPE_SITE``), or built here.
Where a tool is missing the browser test is skipped, except under CI (``CI`` set), where it fails:
`.ci/run` installs Chromium and the driver.
"""
from __future__ import annotations

import functools
import http.server
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import vispe
from conftest import load_docs_hooks

ROOT = Path(__file__).resolve().parents[1]
hooks = load_docs_hooks()


def need(what: str, found):
    """``found`` when truthy; else a skip on a developer's machine and a failure under CI."""
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing: .ci/run installs it")
        pytest.skip(f"{what} is missing (pip install -e '.[docs,dev]'; apt-get install chromium chromium-driver)")
    return found


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# ------------------------------------------------------------------ tables from the registry
def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines()[2:]]


def test_encodings_page_shows_every_registered_encoding_with_the_registrys_family_and_mask_awareness():
    from vispe.__main__ import mask_awareness

    page = (ROOT / "docs" / "encodings.md").read_text()
    for name in ("encodings", "families", "options"):
        assert f"<!-- vispe:table {name} -->" in page
    filled = hooks.fill_tables(page)
    assert "<!-- vispe:table" not in filled
    described = page.split("<!-- vispe:table encodings -->\n", 1)[1].split("\n\n", 1)[0]
    rows = _rows(hooks.encodings_table(described))
    assert [r[0] for r in rows] == [f"`{m.group(1)}`" for m in map(hooks.DESCRIPTION.match, described.splitlines()[2:])]
    assert sorted(r[0].strip("`") for r in rows) == vispe.available()
    for name, family, mask, _ in rows:
        cls = vispe.registry.get(name.strip("`"))
        assert (family, mask) == (cls.family, mask_awareness(cls)), name


def test_a_registered_encoding_without_a_description_or_a_description_of_none_is_an_error():
    described = "| name | what it is |\n|---|---|\n" + "".join(f"| `{n}` | x |\n" for n in vispe.available())
    hooks.encodings_table(described)  # complete: fine
    with pytest.raises(ValueError, match="registered but not described: \\['sine'\\]"):
        hooks.encodings_table(described.replace("| `sine` | x |\n", ""))
    with pytest.raises(ValueError, match="described but not registered: \\['sinee'\\]"):
        hooks.encodings_table(described + "| `sinee` | x |\n")
    with pytest.raises(ValueError, match="unknown table 'encoding'"):
        hooks.fill_tables("<!-- vispe:table encoding -->\n")


def test_families_and_options_tables_list_the_registry():
    fam = {r[0]: r[2] for r in _rows(hooks.families_table())}
    assert set(fam) == {vispe.family_of(n) for n in vispe.available()}
    for name in vispe.available():
        assert f"`{name}`" in fam[vispe.family_of(name)].split(", "), name
    opts = {r[0].strip("`"): r[1] for r in _rows(hooks.options_table())}
    assert sorted(opts) == vispe.available()
    for name, cell in opts.items():
        params = inspect.signature(vispe.registry.get(name).__init__).parameters
        for p in params.values():
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                assert f"`{p.name}" in cell, (name, p.name)
    assert "`head_dim` (required)" in opts["rope_axial"] and "`temperature=10000.0`" in opts["sine"]


# ------------------------------------------------------------------ links
@pytest.mark.parametrize("repo_path, src_uri, link, want", [
    ("README.md", "index.md", "docs/encodings.md#the-registry", "encodings.md#the-registry"),
    ("README.md", "index.md", "results/compare/figures/a.png", "results/compare/figures/a.png"),
    ("docs/encodings.md", "encodings.md", "../results/bench_vit_step.md", "results/bench_vit_step.md"),
    ("docs/guides/vit.md", "guides/vit.md", "../encodings.md", "../encodings.md"),
    ("docs/guides/vit.md", "guides/vit.md", "../../README.md", "../index.md"),
    ("docs/guides/vit.md", "guides/vit.md", "../../configs/default.yaml", "../configs/default.yaml"),
    ("results/compare/x.md", "results/compare/x.md", "../../notebooks/a.ipynb", "../../notebooks/a.ipynb"),
    ("docs/x.md", "x.md", "../vispe/encoding.py", "../vispe/encoding.py"),  # not in the site: left for mkdocs to report
    ("docs/x.md", "x.md", "https://example.org/a.md", "https://example.org/a.md"),
])
def test_links_written_as_repository_paths_point_at_the_page_they_become(repo_path, src_uri, link, want):
    md = f"see [it]({link}) and\n```python\nx[0](y)\n```\n"
    assert hooks.rewrite_links(md, repo_path, src_uri) == f"see [it]({want}) and\n```python\nx[0](y)\n```\n"


def test_api_reference_has_a_page_for_every_public_module():
    pages = hooks.api_modules()
    modules = {m for mods in pages.values() for m in mods}
    for path in (ROOT / "vispe").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        assert (name in modules) == (not any(p.startswith("_") and p != "__init__" for p in parts)), name
    assert pages["vispe.encoding"] == ["vispe.encoding"] and "vispe.models.detr.queries.positioned" in pages["vispe.models.detr.queries"]


def test_docstrings_are_markdown_without_rst_tables():
    """The API reference renders docstrings as Markdown: an RST simple table (rows of ===) would
    come out as a paragraph of equals signs, so tables in docstrings are Markdown tables."""
    import ast
    import re

    found = []
    for path in sorted((ROOT / "vispe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                if re.search(r"^\s*=+( +=+)+\s*$", doc, flags=re.M):
                    found.append(f"{path.relative_to(ROOT)}: {getattr(node, 'name', 'module')}")
    assert not found, found


# ------------------------------------------------------------------ the built site, in a browser
@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    given = os.environ.get("VISPE_SITE")
    if given:
        assert (Path(given) / "index.html").is_file(), f"VISPE_SITE={given}: no built site there"
        return Path(given)
    need("mkdocs (the docs extra)", _module("mkdocs") and _module("mkdocstrings") and _module("material"))
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, env=env,
                   check=True)
    return out


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    webdriver = need("selenium (the dev extra)", _module("selenium.webdriver"))
    chromium = need("chromium", shutil.which("chromium"))
    driver_path = need("chromedriver (Debian's chromium-driver)", shutil.which("chromedriver"))
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


STATE = """
const imgs = Array.from(document.querySelectorAll("article img"));
const header = document.querySelector(".md-header");
return {
  ready: document.readyState,
  h1: (document.querySelector("article h1") || {}).textContent || "",
  images: imgs.map(i => [i.getAttribute("src"), i.complete && i.naturalWidth > 0]),
  headerColour: header ? getComputedStyle(header).backgroundColor : "",
  navLinks: document.querySelectorAll(".md-nav__link").length,
  apiObjects: document.querySelectorAll(".doc-class, .doc-function").length,
  signatures: Array.from(document.querySelectorAll(".doc-signature")).map(s => s.textContent),
  text: document.querySelector("article").innerText,
};
"""

PAGES = {  # path: (h1 starts with, at least this many figures)
    "": ("vispe — 2D positional encodings", 1),
    "guides/train/": ("Guide: train and compare encodings", 1),
    "api/vispe.encoding/": ("vispe.encoding", 0),
}


@pytest.mark.parametrize("path", list(PAGES))
def test_site_pages_render_in_chromium_with_their_figures(path, served, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(served + path)
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    state = browser.execute_script(STATE)
    title, figures = PAGES[path]
    assert state["h1"].startswith(title), state["h1"]
    assert len(state["images"]) >= figures and all(ok for _, ok in state["images"]), state["images"]
    assert state["headerColour"] not in ("", "rgba(0, 0, 0, 0)"), "Material's stylesheet did not load"
    assert state["navLinks"] > 30  # the whole navigation, API pages included
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # a missing script, stylesheet or image is logged as one
    if path.startswith("api/"):
        assert state["apiObjects"] >= 5 and any("PositionEncoding" in s or "at(" in s for s in state["signatures"])
        assert "class PositionEncoding" in state["text"] or "PositionEncoding" in state["text"]
    shots = os.environ.get("VISPE_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(shots) / ((path.strip("/").replace("/", "_") or "index") + ".png")))
