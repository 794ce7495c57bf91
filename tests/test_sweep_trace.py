"""Rows that carry what their runs used (vispe.sweep.trace): the wrapper records the repository files a run
imported and its config, with their git blob hashes, and refuses a record it cannot trust (a file edited while
it ran, a resumed part after an edit or after a part that died without its record); update.py's
``<name>_code.json`` lets results/compare/freshness.py judge those rows by those files only."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from vispe.sweep import trace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "results" / "compare"))
import freshness  # noqa: E402


def blob(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """train.py importing pkg/used.py (not pkg/unused.py), and a config."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    for f, text in {"train.py": "import sys\nimport pkg.used\nsys.exit(int(sys.argv[-1]))\n", "pkg/__init__.py": "",
                    "pkg/used.py": "x = 1\n", "pkg/unused.py": "y = 1\n", "configs/c.yaml": "a: 1\n"}.items():
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(text)
    (tmp_path / "run").mkdir()
    return tmp_path


def run(repo: Path, rc: int = 0) -> dict | None:
    argv, env = trace.traced([sys.executable, str(repo / "train.py"), "--config", "configs/c.yaml", str(rc)], repo / "run")
    done = subprocess.run(argv, cwd=repo, env={**os.environ, **env, "PYTHONPATH": str(repo)}, capture_output=True, text=True)
    assert done.returncode == rc, done.stderr
    return trace.read(repo / "run")


def test_the_record_names_the_imported_files_and_the_config_with_their_hashes(repo):
    files = run(repo)
    assert files == {p: blob(repo / p) for p in ("train.py", "pkg/__init__.py", "pkg/used.py", "configs/c.yaml")}
    assert run(repo, rc=3) == files  # a run that stops (sys.exit) records too; the same code: the same record


def test_a_record_is_refused_after_an_edit_between_parts_or_a_part_without_record(repo):
    run(repo)
    (repo / "pkg" / "used.py").write_text("x = 2\n")  # edited, then the run resumed
    assert run(repo) is None
    rec = json.loads((repo / "run" / trace.FILE).read_text())
    assert rec["edited"] == ["pkg/used.py"] and rec["files"]["pkg/used.py"] == blob(repo / "pkg" / "used.py")
    (repo / "run" / trace.FILE).unlink()
    assert run(repo) is not None
    (repo / "run" / trace.FILE).write_text(json.dumps({"files": {}, "edited": ["(a part ended without ...)"]}))
    assert run(repo) is None  # what a SIGKILLed part leaves: the next part's record is not trusted


def test_by_commit_unions_runs_and_merge_keeps_an_untraced_commit_untraced(tmp_path):
    for run_name, files in (("a", {"x.py": "1"}), ("b", {"x.py": "1", "y.py": "2"}), ("c", {"x.py": "3"})):
        (tmp_path / run_name).mkdir()
        (tmp_path / run_name / trace.FILE).write_text(json.dumps({"files": files, "edited": []}))
    (tmp_path / "d").mkdir()  # finished, no record
    df = pd.DataFrame({"run": ["a", "a", "b", "c", "d", "e"], "status": ["finished"] * 5 + ["unfinished"],
                       "commit": ["s1", "s1", "s1", "s2+dirty", "s3", "s1"]})
    got = trace.by_commit(tmp_path, df)
    assert got == {"s1": {"x.py": "1", "y.py": "2"}, "s2+dirty": {"x.py": "3"}, "s3": None}
    assert trace.merge({"s1": {"x.py": "9"}, "s3": {"x.py": "1"}}, got) == {
        "s1": {"x.py": trace.CONFLICT, "y.py": "2"}, "s2+dirty": {"x.py": "3"}, "s3": None}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_traced_rows_are_judged_by_the_files_their_runs_used(repo):
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@t")
    git(repo, "config", "user.name", "t")
    (repo / "vispe").mkdir()
    (repo / "vispe" / "towers.py").write_text("t = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a")
    a = git(repo, "rev-parse", "HEAD")
    data = repo / "results" / "compare" / "data"
    data.mkdir(parents=True)
    csv = data / "c.csv"
    csv.write_text(f"run,acc,commit\nr0,0.5,{a}\nr1,0.5,{a}+dirty\n")
    (repo / "vispe" / "towers.py").write_text("t = 2\n")  # a package file these runs did not import
    assert set(freshness.check(repo)[0].stale) == {a, a + "+dirty"}  # without a record: the whole package
    used = {p: freshness.file_hash(repo, p) for p in ("train.py", "configs/c.yaml", "pkg/used.py")}
    (data / "c_code.json").write_text(json.dumps({a: used, a + "+dirty": used}))
    v = freshness.check(repo)[0]
    assert v.state == "fresh" and [Path(t.csv).name for t in freshness.check(repo)] == ["c.csv"]
    (repo / "pkg" / "used.py").write_text("x = 2\n")
    v = freshness.check(repo)[0]
    assert v.state == "STALE, NOT MARKED" and "pkg/used.py" in v.stale[a] and "pkg/used.py" in v.stale[a + "+dirty"]
    (data / "c_code.json").write_text(json.dumps({a: None}))  # a commit with an untraced run: the whole package
    assert "vispe/towers.py" in freshness.check(repo)[0].stale[a]
