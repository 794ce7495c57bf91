"""The documentation's code blocks run as written (issue 19, item 9; issue 40: the README and every
page of docs/, the guides included).

Every ```python block is executed, in order, each in a fresh namespace. A block that cannot run in
the suite (it needs a download or a GPU, or takes long) must start with the visible marker
``# not run by the tests: <why>``; it is still compiled. The ```bash blocks are commands: every
``train.py`` command is parsed and its config loaded and checked as ``train.py`` does before
training (keys, types, values, encoding names; training itself is covered by the train tests), and
every file a command names must exist.
"""
from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch

import vispe.registry
from vispe.train import config as C

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# not run by the tests:"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
QUICKSTART = ("python3 bootstrap.py train.py\npython3 bootstrap.py -m pytest -q -n 2\n")


def page_name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(lang: str, pages=PAGES) -> list[tuple[str, int, str]]:
    """(page, index on the page, code) of every ```lang block."""
    out = []
    for page in pages:
        found = re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), flags=re.S | re.M)
        out += [(page_name(page), i + 1, code) for i, code in enumerate(found)]
    return out


def _train_script():
    spec = importlib.util.spec_from_file_location("train_script_for_docs", ROOT / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    return train


def test_the_pages_have_python_and_bash_blocks_and_every_guide_runs_code():
    assert len(blocks("python")) >= 10 and len(blocks("bash")) >= 8
    guides = sorted((ROOT / "docs" / "guides").glob("*.md"))
    assert len(guides) >= 7
    for guide in guides:
        assert blocks("python", [guide]) or blocks("bash", [guide]), f"{page_name(guide)} has no example"


@pytest.mark.parametrize("page, i, src", blocks("python"), ids=[f"{p}#{i}" for p, i, _ in blocks("python")])
def test_python_block_runs_as_written(page, i, src, monkeypatch, tmp_path):
    code = compile(src, f"{page} python block {i}", "exec")
    if src.startswith(MARKER):
        reason = src.splitlines()[0][len(MARKER):].strip()
        assert reason, "say why the block cannot run"
        pytest.skip(f"{page} block {i}: {reason}")
    monkeypatch.chdir(tmp_path)  # anything it writes goes there
    torch.manual_seed(0)
    exec(code, {"__name__": f"docs_block_{i}"})


def _commands():
    for page, _, block in blocks("bash"):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                yield page, line


@pytest.mark.parametrize("page, line", list(_commands()), ids=[f"{p}: {line}" for p, line in _commands()])
def test_bash_command_names_existing_files_and_a_valid_train_config(page, line):
    words = shlex.split(line)
    for w in words:
        if re.fullmatch(r"[\w./-]+\.(py|yaml)", w) and "=" not in w:
            assert (ROOT / w).is_file(), f"{page}: {line!r}: {w} does not exist"
    if "train.py" not in words:
        return
    train = _train_script()
    args = train.parse_args(words[words.index("train.py") + 1:])
    if args.config and "<run_name>" in args.config:  # a run's stored config (written by the run)
        assert args.config == "runs/<run_name>/config.yaml" and args.resume
        return
    cfg = C.load_config(ROOT / args.config if args.config else train.DEFAULT_CONFIG, args.overrides, smoke=args.smoke)
    for pe in C.encodings(cfg):
        vispe.registry.get(pe)  # an unknown encoding name is a ValueError


def test_commands_after_the_quickstart_use_one_python_stated_once():
    """One way to run things (issue 28, item 8): the Quickstart runs bootstrap.py (the README's and
    the install page's copy of it); every other command says `python`, the environment's, which the
    install page says how to get, once; train.py's resume hint is the documentation's command."""
    texts = {page_name(p): p.read_text() for p in PAGES}
    for name in ("README.md", "docs/install.md"):
        assert "```bash\n" + QUICKSTART + "```" in texts[name], name
    assert sum(t.count("source .venv/bin/activate") for t in texts.values()) == 1
    assert "source .venv/bin/activate" in texts["docs/install.md"]
    lines = [(page, line) for page, line in _commands()]
    others = [(p, line) for p, line in lines if line not in QUICKSTART.splitlines()]
    assert others and all(line.startswith(("python ", "torchrun ", "pip ")) for _, line in others), others
    resume = _train_script().RESUME_HINT.format(config="runs/<run_name>/config.yaml")
    assert any(resume in t for t in texts.values())


def test_the_readme_is_a_landing_page():
    """What, the Quickstart, one example, links into the site (issue 40): short, and each link to a
    page of docs/ names a page that exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 80
    assert len(blocks("python", [ROOT / "README.md"])) == 1
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 15
    for link in links:
        assert (ROOT / link).is_file(), link
