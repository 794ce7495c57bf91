"""tools/mutants.py (issue 56), the tool itself: every planted bug of its list is found exactly once
under vispe/ and names test files that exist; a snippet found nowhere or twice is "not applicable";
one mutant, run end to end in a temporary copy, is caught and leaves the working tree untouched
(the whole list takes a quarter of an hour: docs/testing.md says how to run it)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location("vispe_mutants_tool", ROOT / "tools" / "mutants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_every_snippet_is_found_exactly_once_and_its_tests_exist():
    tool = _tool()
    assert len(tool.MUTANTS) >= 40
    assert len({m.name for m in tool.MUTANTS}) == len(tool.MUTANTS)
    for m in tool.MUTANTS:
        path, why = tool.where(m)
        assert path is not None, f"{m.name}: {why}"
        assert m.replacement != m.snippet and m.tests and not tool.missing_tests(m), m.name
    areas = {str(tool.where(m)[0]).split("/")[1] for m in tool.MUTANTS}  # vispe/<area>
    assert {"coords.py", "kernels", "image", "models"} <= areas


def test_a_snippet_found_nowhere_or_twice_is_not_applicable(tmp_path):
    tool = _tool()
    (tmp_path / "vispe" / "a").mkdir(parents=True)
    (tmp_path / "vispe" / "a" / "x.py").write_text("y = 1\nz = 2\n")
    (tmp_path / "vispe" / "b.py").write_text("z = 2\n")
    found = tool.Mutant("found", "vispe/a/x.py", "y = 1", "y = 2", ("tests/t.py",), "")
    assert tool.where(found, tmp_path) == (Path("vispe/a/x.py"), "")
    for snippet, count in (("w = 0", 0), ("z = 2", 2)):
        m = tool.Mutant("m", "vispe/b.py", snippet, "q", ("tests/t.py",), "")
        path, why = tool.where(m, tmp_path)
        assert path is None and f"found {count} times" in why
        outcome = tool.run_mutant(m, tmp_path, timeout=10)
        assert outcome.status == "not applicable"


@pytest.mark.slow
def test_one_mutant_is_caught_in_a_copy_and_the_tree_is_untouched(tmp_path):
    tool = _tool()
    m = next(m for m in tool.MUTANTS if m.name == "sine_offset_sign")
    path, _ = tool.where(m)
    before = (ROOT / path).read_text()
    m = tool.dataclasses.replace(m, tests=("tests/test_image_additive.py::test_sine_offset_without_normalize_shifts_the_count",))
    tree = tmp_path / "tree"
    tool.copy_tree(tree, None)
    outcome = tool.run_mutant(m, tree, timeout=300)
    assert outcome.status == "caught", outcome
    assert (ROOT / path).read_text() == before and (tree / path).read_text() == before
    passing = tool.dataclasses.replace(m, replacement=m.snippet + " ")  # a change the test cannot see
    assert tool.run_mutant(passing, tree, timeout=300).status == "survived"
