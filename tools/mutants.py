"""Planted bugs in the position code, and whether the tests named for each catch it (issue 56).

    python tools/mutants.py                       # every mutant; writes results/mutants.md
    python tools/mutants.py --dry-run             # only check that every snippet is found exactly once
    python tools/mutants.py --only lookhere_zerocorners_up_right --report -
    python tools/mutants.py --tests-at 77c7ae1    # the mutants against another commit's tests/

A mutant (``tools/mutant_list.py``) is a code snippet, its replacement and the test files (or node
ids) that must catch it. The snippet is searched for under ``vispe/`` (the path given is only a
hint, so a mutant survives files being moved or split): found exactly once, it is replaced in a
temporary copy of the tree (never the working tree), the named tests run there (``pytest -x``,
with a timeout), and the mutant is *caught* when they fail, *survived* when they pass. A snippet
found nowhere or more than once is *not applicable*: an error of the list, reported, never a pass;
a run past the timeout is reported as such, not as caught. The report gives caught / total, the
survivors and the errors, with the machine, the command and the commit. Exit status 0 only when
every mutant was caught.

Too long for ``.ci/run`` (each mutant runs its tests); ``tests/test_mutants.py`` runs ``--dry-run``
and one mutant. Run it before a stage's closing note, under the heavy-job lock on a shared machine:
``flock /tmp/vispe-heavy.lock python tools/mutants.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from mutant_list import MUTANTS, Mutant  # noqa: E402,F401 (Mutant: for callers)

#: what the temporary copy leaves out (git's, the virtual environment, built and cached files)
SKIP = {".git", ".venv", "site", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist",
        "runs", "results", "bench", "notebooks"}


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # "caught" | "survived" | "not applicable" | "timeout"
    seconds: float
    detail: str


def locate(snippet: str, root: Path = ROOT) -> list[tuple[Path, int]]:
    """Every (file, count) under ``root/vispe`` whose text contains ``snippet``."""
    hits = []
    for path in sorted((root / "vispe").rglob("*.py")):
        n = path.read_text().count(snippet)
        if n:
            hits.append((path.relative_to(root), n))
    return hits


def where(mutant, root: Path = ROOT) -> tuple[Path | None, str]:
    """The one file holding the mutant's snippet once, or None and why not."""
    hits = locate(mutant.snippet, root)
    total = sum(n for _, n in hits)
    if total == 1:
        return hits[0][0], ""
    found = ", ".join(f"{p} x{n}" for p, n in hits) or "nowhere"
    return None, f"snippet found {total} times under vispe/ ({found}; hint {mutant.path}): expected exactly once"


def missing_tests(mutant, root: Path = ROOT) -> list[str]:
    return [t for t in mutant.tests if not (root / t.split("::", 1)[0]).is_file()]


def copy_tree(dst: Path, tests_at: str | None) -> None:
    """The working tree (tracked and untracked files, less ``SKIP``) into ``dst``; ``tests/`` from commit
    ``tests_at`` when given."""
    def ignore(_dir, names):
        return [n for n in names if n in SKIP or n.endswith(".pyc")]

    shutil.copytree(ROOT, dst, ignore=ignore, dirs_exist_ok=True, symlinks=True)
    for keep in ("results/compare",):  # scripts the tests load from results/
        if (ROOT / keep).is_dir():
            shutil.copytree(ROOT / keep, dst / keep, ignore=ignore, dirs_exist_ok=True)
    if tests_at:
        shutil.rmtree(dst / "tests")
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", tests_at, "tests"], check=True,
                             capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            t.extractall(dst, filter="data")


def run_tests(tree: Path, tests, timeout: float) -> tuple[int | None, str]:
    """pytest -x on ``tests`` inside ``tree``: (exit status or None on timeout, the output's tail)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0", *tests]
    try:
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timeout after {timeout:.0f} s"
    out = [ln for ln in p.stdout.splitlines() if ln.strip()]
    first = next((ln for ln in out if ln.startswith(("FAILED ", "ERROR "))), None)
    return p.returncode, (first or (out[-1] if out else p.stderr.strip()[-200:]))[:200].replace("|", "/")


def run_mutant(mutant, tree: Path, timeout: float) -> Outcome:
    t0 = time.perf_counter()
    path, why = where(mutant, tree)
    bad = missing_tests(mutant, tree)
    if path is None or bad:
        return Outcome(mutant.name, "not applicable", 0.0, why or f"test files missing: {bad}")
    original = (tree / path).read_text()
    (tree / path).write_text(original.replace(mutant.snippet, mutant.replacement))
    try:
        code, tail = run_tests(tree, mutant.tests, timeout)
    finally:
        (tree / path).write_text(original)
    dt = time.perf_counter() - t0
    if code is None:
        return Outcome(mutant.name, "timeout", dt, tail)
    if code == 0:
        return Outcome(mutant.name, "survived", dt, tail)
    if code == 1:  # tests failed
        return Outcome(mutant.name, "caught", dt, tail)
    if code == 2:  # the mutant broke an import or the collection: the named tests did not pass
        return Outcome(mutant.name, "caught", dt, f"pytest exit 2 (interrupted: import or collection error): {tail}")
    return Outcome(mutant.name, "not applicable", dt, f"pytest exit {code} (no tests run: a node id not found?): {tail}")


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "vispe", "tests", "tools"],
                               capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "?"


def report(outcomes: list[Outcome], mutants, argv: list[str], tests_at: str | None, wall: float) -> str:
    by = {m.name: m for m in mutants}
    caught = sum(o.status == "caught" for o in outcomes)
    lines = [
        "# Planted bugs and the tests that catch them",
        "",
        "Written by `tools/mutants.py` (issue 56): each mutant is one small bug planted in a temporary copy of the tree; "
        "the test files it names must fail. How to run it: [testing](../docs/testing.md#planted-bugs).",
        "",
        f"- **caught {caught} / {len(outcomes)}**",
        f"- command: `python tools/{' '.join(['mutants.py', *argv])}`",
        f"- commit: {commit()}" + (f"; tests from {tests_at}" if tests_at else ""),
        f"- machine: {machine()} (shared with other jobs); "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {wall / 60:.1f} min",
        "",
    ]
    others = [o for o in outcomes if o.status != "caught"]
    if others:
        lines += ["## Not caught", "", "| mutant | status | what it plants | tests | detail |", "|---|---|---|---|---|"]
        lines += [f"| `{o.name}` | {o.status} | {by[o.name].why} | {', '.join(by[o.name].tests)} | {o.detail} |"
                  for o in others]
        lines.append("")
    lines += ["## Every mutant", "", "| mutant | file | what it plants | tests | status | s |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        m = by[o.name]
        lines.append(f"| `{o.name}` | `{m.path}` | {m.why} | {', '.join(m.tests)} | {o.status} | {o.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="mutant names (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="check that every snippet is found exactly once, run nothing")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's tests (default 600)")
    ap.add_argument("--tests-at", help="a commit whose tests/ replace the working tree's in the copy")
    ap.add_argument("--tests", nargs="*", help="run these tests for every mutant instead of the ones each names")
    ap.add_argument("--report", default="results/mutants.md", help="where to write the report ('-': stdout only)")
    args = ap.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.tests:
        mutants = [dataclasses.replace(m, tests=tuple(args.tests)) for m in mutants]
    if args.only and len(mutants) != len(set(args.only)):
        unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
        print(f"--only: unknown mutant(s) {unknown}", file=sys.stderr)
        return 2
    names = [m.name for m in MUTANTS]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        print(f"duplicate mutant names: {dupes}", file=sys.stderr)
        return 2
    if args.dry_run:
        bad = 0
        for m in mutants:
            path, why = where(m)
            miss = missing_tests(m)
            if path is None or miss or m.snippet == m.replacement:
                bad += 1
                print(f"NOT APPLICABLE {m.name}: {why or ''}{' tests missing: ' + str(miss) if miss else ''}"
                      f"{' replacement equals the snippet' if m.snippet == m.replacement else ''}")
            else:
                print(f"ok {m.name}: {path}")
        print(f"{len(mutants) - bad} / {len(mutants)} applicable")
        return 1 if bad else 0
    t0 = time.perf_counter()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="vispe-mutants-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree, args.tests_at)
        for i, m in enumerate(mutants, 1):
            o = run_mutant(m, tree, args.timeout)
            outcomes.append(o)
            print(f"[{i}/{len(mutants)}] {o.status:>14}  {o.name}  ({o.seconds:.0f} s) {o.detail}", flush=True)
    text = report(outcomes, mutants, sys.argv[1:] if argv is None else argv, args.tests_at, time.perf_counter() - t0)
    if args.report == "-":
        print(text)
    else:
        (ROOT / args.report).write_text(text)
        print(f"wrote {args.report}")
    return 0 if all(o.status == "caught" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
