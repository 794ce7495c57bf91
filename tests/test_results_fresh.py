"""results/compare/freshness.py: a results CSV whose commit's run files differ from this checkout fails
the check unless a mark covers it (issue 29 item 1); a mark records the hashes of the files the runs
import and expires when one changes (issue 53); remark.py writes a mark only from equal smoke runs."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "results" / "compare"))
import freshness  # noqa: E402

needs_git = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                               reason="needs git and this repository's history")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A tiny repository: train.py, one config, vispe/ with a run file and an excluded one, a CSV."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    for f, text in {"train.py": "x = 1\n", "configs/digits_cell.yaml": "a: 1\n", "configs/shapes_detr.yaml": "a: 1\n",
                    "vispe/attention.py": "y = 1\n", "vispe/report.py": "z = 1\n", "vispe/detr.py": "w = 1\n"}.items():
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(text)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "a")
    (tmp_path / "results" / "compare" / "data").mkdir(parents=True)
    return tmp_path


def write_csv(repo: Path, name: str, commits: list[str]) -> Path:
    f = repo / "results" / "compare" / "data" / name
    f.write_text("run,acc,commit\n" + "".join(f"r{i},0.5,{c}\n" for i, c in enumerate(commits)))
    return f


def commit_change(repo: Path, path: str) -> str:
    """Commit a change of ``path`` that a run can see (a YAML config gets a new key, not just a comment)."""
    text = (repo / path).read_text()
    (repo / path).write_text(text + (f"changed_{len(text)}: 1\n" if path.endswith(".yaml") else "# changed\n"))
    git(repo, "commit", "-qam", f"change {path}")
    return git(repo, "rev-parse", "HEAD")


def states(repo: Path) -> dict[str, str]:
    return {Path(v.csv).name: v.state for v in freshness.check(repo)}


def test_fresh_then_stale_then_marked_then_expired(repo):
    a = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [a, a])
    assert states(repo) == {"digits_cell.csv": "fresh"}
    assert freshness.report(freshness.check(repo))[1] == 0
    commit_change(repo, "vispe/report.py")  # excluded: not a file training imports
    commit_change(repo, "configs/shapes_detr.yaml")  # another task's config
    assert states(repo) == {"digits_cell.csv": "fresh"}
    commit_change(repo, "vispe/attention.py")
    v = freshness.check(repo)[0]
    assert v.state == "STALE, NOT MARKED" and "vispe/attention.py" in v.stale[a]
    assert freshness.report([v])[1] == 1
    entry = freshness.mark("results/compare/data/digits_cell.csv", "too long to rerun here", root=repo,
                           evidence="smoke runs equal")
    assert entry["files"]["vispe/attention.py"] == freshness.blob((repo / "vispe/attention.py").read_bytes())
    assert entry["at"] == git(repo, "rev-parse", "HEAD") and "vispe/report.py" not in entry["files"]
    assert states(repo) == {"digits_cell.csv": "stale, marked"}
    assert freshness.report(freshness.check(repo))[1] == 0
    commit_change(repo, "vispe/attention.py")  # a file the mark recorded changes: the mark expires
    v = freshness.check(repo)[0]
    assert v.state == "STALE, MARK EXPIRED" and v.expired == ["vispe/attention.py"]
    text, rc = freshness.report([v])
    assert rc == 1 and "vispe/attention.py" in text and "--remark" in text
    assert "**STALE**" in freshness.status_line(v) and "vispe/attention.py" in freshness.status_line(v)


def test_a_mark_expires_only_with_the_files_it_recorded_and_on_uncommitted_edits(repo):
    a = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [a])
    commit_change(repo, "vispe/attention.py")
    imported = {p: freshness.file_hash(repo, p) for p in ("train.py", "vispe/attention.py")}  # a traced set
    freshness.mark("results/compare/data/digits_cell.csv", "why", root=repo, evidence="equal", files=imported)
    commit_change(repo, "vispe/detr.py")  # a run file the traced runs did not import
    assert states(repo) == {"digits_cell.csv": "stale, marked"}
    (repo / "train.py").write_text("x = 2\n")  # not committed: the checkout is what the check reads
    v = freshness.check(repo)[0]
    assert v.state == "STALE, MARK EXPIRED" and v.expired == ["train.py"]
    (repo / "train.py").write_text("x = 1\n")
    assert states(repo) == {"digits_cell.csv": "stale, marked"}


def test_an_uncommitted_edit_makes_a_fresh_csv_stale(repo):
    write_csv(repo, "digits_cell.csv", [git(repo, "rev-parse", "HEAD")])
    (repo / "vispe" / "attention.py").write_text("y = 2\n")
    v = freshness.check(repo)[0]
    assert v.state == "STALE, NOT MARKED" and "vispe/attention.py" in freshness.explain(v)


def test_a_mark_without_file_hashes_does_not_hold(repo):
    """Marks written before issue 53 name commits and a reason only: they cannot tell what changed since."""
    a = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [a])
    commit_change(repo, "vispe/attention.py")
    rel = "results/compare/data/digits_cell.csv"
    (repo / freshness.MARKS).write_text(json.dumps({rel: {"commits": [a], "reason": "old"}}))
    v = freshness.check(repo)[0]
    assert v.state == "STALE, MARK EXPIRED" and "vispe/attention.py" in freshness.explain(v)


def test_a_record_mark_keeps_old_rows_as_their_commits_record(repo):
    a = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [a])
    commit_change(repo, "vispe/attention.py")
    freshness.mark("results/compare/data/digits_cell.csv", "the old grid", root=repo, record=True)
    commit_change(repo, "vispe/attention.py")
    v = freshness.check(repo)[0]
    assert v.state == "record" and v.ok and a[:7] in freshness.status_line(v)


def test_config_change_makes_its_task_stale(repo):
    write_csv(repo, "digits_cell.csv", [git(repo, "rev-parse", "HEAD")])
    (repo / "configs/digits_cell.yaml").write_text("a: 2\n")
    git(repo, "commit", "-qam", "a value of the config")
    assert states(repo) == {"digits_cell.csv": "STALE, NOT MARKED"}


def test_a_config_comment_changes_nothing_a_value_does(repo):
    """A YAML config whose parsed content is equal (its header comment rewritten, keys re-laid) leaves its
    tables fresh, for a CSV judged by commit and for a traced one (``_code.json``) and a mark alike."""
    head = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [head])
    traced = write_csv(repo, "shapes_detr.csv", [head])
    files = {p: freshness.file_hash(repo, p) for p in ("train.py", "configs/shapes_detr.yaml", "vispe/detr.py")}
    traced.with_name("shapes_detr_code.json").write_text(json.dumps({head: files}))
    (repo / "configs/digits_cell.yaml").write_text("a: 1\n# a comment appended\n")
    (repo / "configs/shapes_detr.yaml").write_text("# Expected result: see the page\na:   1  # one\n")
    git(repo, "commit", "-qam", "comments only")
    assert states(repo) == {"digits_cell.csv": "fresh", "shapes_detr.csv": "fresh"}
    (repo / "configs/shapes_detr.yaml").write_text("a: 1\nb: 2\n")  # a new key, uncommitted
    assert states(repo) == {"digits_cell.csv": "fresh", "shapes_detr.csv": "STALE, NOT MARKED"}
    (repo / "configs/shapes_detr.yaml").write_text("a: [1\n")  # unparsable: changed
    assert freshness.differs(repo, "configs/shapes_detr.yaml", files["configs/shapes_detr.yaml"],
                             freshness.file_hash(repo, "configs/shapes_detr.yaml"))


def test_mark_covers_only_the_commits_it_recorded(repo):
    a = git(repo, "rev-parse", "HEAD")
    f = write_csv(repo, "digits_cell.csv", [a])
    b = commit_change(repo, "vispe/attention.py")
    freshness.mark(str(f), "old", root=repo, evidence="equal")
    assert states(repo) == {"digits_cell.csv": "stale, marked"}
    c = commit_change(repo, "train.py")
    write_csv(repo, "digits_cell.csv", [a, b])  # rows from b added later: b is stale too, not covered
    assert states(repo) == {"digits_cell.csv": "STALE, NOT MARKED"}
    write_csv(repo, "digits_cell.csv", [c])  # rerun at today's code: fresh, the mark is not needed
    assert states(repo) == {"digits_cell.csv": "fresh"}


def test_unknown_and_non_ancestor_commits_are_stale(repo):
    write_csv(repo, "digits_cell.csv", ["0123456789abcdef0123456789abcdef01234567"])  # rewritten history
    v = freshness.check(repo)[0]
    assert v.stale == {"0123456789abcdef0123456789abcdef01234567": "not in this repository's history"}
    git(repo, "checkout", "-qb", "side")
    side = commit_change(repo, "vispe/report.py")
    git(repo, "checkout", "-q", "-")
    write_csv(repo, "digits_cell.csv", [side])
    assert freshness.check(repo)[0].stale == {side: "not an ancestor of HEAD"}


def test_a_run_from_uncommitted_changes_is_stale_and_named_as_such(repo):
    """vispe.sweep writes ``<sha>+dirty`` for a run with uncommitted changes: the commit exists, its files are not
    the run's; it was reported "not in this repository's history" and shown as the clean commit's 7 digits."""
    a = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [a + "+dirty", a])
    v = freshness.check(repo)[0]
    assert v.state == "STALE, NOT MARKED" and list(v.stale) == [a + "+dirty"]  # the clean commit is fresh
    why = v.stale[a + "+dirty"]
    assert why.startswith(f"ran from uncommitted changes on top of {a[:7]}") and "not in this repository" not in why
    assert f"{a[:7]}+dirty: ran from uncommitted" in freshness.explain(v)
    assert f"{a[:7]}+dirty, {a[:7]} |" in freshness.markdown([v], repo)
    freshness.mark("results/compare/data/digits_cell.csv", "why", root=repo, evidence="smoke runs equal")
    assert states(repo) == {"digits_cell.csv": "stale, marked"}  # a mark can cover it, like any stale commit
    gone = "0123456789abcdef0123456789abcdef01234567+dirty"
    write_csv(repo, "digits_cell.csv", [gone])
    assert "(0123456 is not in this repository's history)" in freshness.check(repo)[0].stale[gone]


def test_the_probe_runners_csv_follows_the_probes_not_train_py(repo):
    """results/padding_leakage.csv is written by vispe.probes.runner: vispe/probes (excluded for training runs)
    is what its rows ran; train.py and the configs are not (the probes' files were not checked before)."""
    (repo / "vispe" / "probes").mkdir()
    (repo / "vispe" / "probes" / "runner.py").write_text("p = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "probes")
    (repo / "results" / "padding_leakage.csv").write_text(f"spc,commit\n0.9,{git(repo, 'rev-parse', 'HEAD')}\n")
    commit_change(repo, "train.py")
    commit_change(repo, "configs/digits_cell.yaml")
    assert states(repo) == {"padding_leakage.csv": "fresh"}
    commit_change(repo, "vispe/probes/runner.py")
    v = freshness.check(repo)[0]
    assert v.state == "STALE, NOT MARKED" and "vispe/probes/runner.py" in freshness.explain(v)


def test_a_csv_named_after_no_config_follows_the_config_its_runs_used(repo):
    """relbias_init_vit.csv's runs use configs/digits_relative.yaml (freshness.CONFIG_OF): another task's config
    leaves it fresh (it followed every config before), its own does not."""
    (repo / "configs" / "digits_relative.yaml").write_text("a: 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "config")
    write_csv(repo, "relbias_init_vit.csv", [git(repo, "rev-parse", "HEAD")])
    commit_change(repo, "configs/shapes_detr.yaml")
    assert states(repo) == {"relbias_init_vit.csv": "fresh"}
    commit_change(repo, "configs/digits_relative.yaml")
    assert "configs/digits_relative.yaml" in next(iter(freshness.check(repo)[0].stale.values()))


def test_csv_without_commit_and_curves(repo):
    d = repo / "results" / "compare" / "data"
    (d / "leak.csv").write_text("a,b\n1,2\n")
    write_csv(repo, "digits_cell.csv", [git(repo, "rev-parse", "HEAD")])
    (d / "digits_cell_curves.csv").write_text("epoch,run\n1,r0\n")  # covered by digits_cell.csv
    assert states(repo) == {"digits_cell.csv": "fresh", "leak.csv": "STALE, NOT MARKED"}
    freshness.mark(str(d / "leak.csv"), "no commit recorded by its runner", root=repo, evidence="probe code unchanged")
    assert states(repo)["leak.csv"] == "stale, marked"


def test_a_note_says_why_a_table_stays_stale_and_covers_nothing(repo):
    a = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [a])
    commit_change(repo, "vispe/attention.py")
    freshness.mark("results/compare/data/digits_cell.csv", "why", root=repo, evidence="equal", extra={"smoke": {"x": 1}})
    commit_change(repo, "vispe/attention.py")  # the mark expires; a remark finds the smoke different
    freshness.note("results/compare/data/digits_cell.csv", "its smoke differs from 96f839e on", root=repo)
    entry = freshness.load_marks(repo)["results/compare/data/digits_cell.csv"]
    assert entry["smoke"] == {"x": 1} and entry["commits"] == [] and "files" not in entry  # kept for a later remark
    v = freshness.check(repo)[0]
    assert v.state == "STALE, NOT MARKED" and not v.ok
    assert freshness.explain(v).startswith("its smoke differs from 96f839e on; code changed since these runs: ")
    assert "96f839e" in freshness.status_line(v) and "96f839e" in freshness.report([v])[0]
    with pytest.raises(ValueError, match="text="):
        freshness.note("results/compare/data/digits_cell.csv", " ", root=repo)


def test_mark_refuses_bad_input(repo):
    with pytest.raises(ValueError, match="reason"):
        freshness.mark("results/compare/data/x.csv", "  ", root=repo)
    with pytest.raises(ValueError, match="evidence="):
        freshness.mark("results/compare/data/x.csv", "why", root=repo)
    with pytest.raises(ValueError, match="csv="):
        freshness.mark("results/compare/data/missing.csv", "why", root=repo, evidence="equal")


@pytest.mark.slow
def test_excluded_packages_are_not_imported_by_the_rest_of_vispe():
    """The conservative rule's exclusions hold: importing train.py and every other vispe module loads none of them."""
    mods = []
    for f in sorted((ROOT / "vispe").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if any(rel == e or rel.startswith(e + "/") for e in freshness.EXCLUDED) or rel == "vispe/__main__.py":
            continue
        mods.append(rel[:-3].replace("/", ".").removesuffix(".__init__"))
    code = ("import importlib, sys\nsys.argv = ['train.py']\nimport train\n"
            f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            f"bad = sorted(m for m in sys.modules if any(m == e[:-3].replace('/', '.') if e.endswith('.py') "
            f"else m.startswith(e.replace('/', '.')) for e in {freshness.EXCLUDED!r}))\nprint(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_remark_writes_a_mark_only_from_equal_smoke_runs(repo, monkeypatch):
    """remark.py: every smoke run equal at the old commit and here -> a new mark with the traced imports'
    hashes; one number different -> nothing written, exit 1 (the runs themselves are same_numbers.py's)."""
    import remark
    import same_numbers

    a = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "digits_cell.csv", [a])
    commit_change(repo, "vispe/attention.py")
    rel = "results/compare/data/digits_cell.csv"
    spec = {"config": "configs/digits_cell.yaml", "runs": [{"pe": "sine"}, {"pe": "rope", "overrides": ["k=v"]}]}
    (repo / freshness.MARKS).write_text(json.dumps({rel: {"commits": [a], "reason": "why", "smoke": spec}}))
    result = {"old": 0.5, "new": 0.5}

    def numbers(tree, config, pe, overrides, out, imports=None):
        if imports is not None:  # the traced run: what it imported, inside and outside the checkout
            imports.write_text(json.dumps([str(repo / "vispe" / "attention.py"), "/usr/lib/python3/os.py"]))
        return {"acc": result["new" if imports is not None else "old"], "pe": pe}

    monkeypatch.setattr(same_numbers, "snapshot", lambda sha: repo)
    monkeypatch.setattr(same_numbers, "numbers", numbers)
    result["new"] = 0.5000001
    assert remark.remark("digits_cell", root=repo, log=lambda *_: None) == 1
    assert "files" not in freshness.load_marks(repo)[rel]  # nothing written
    result["new"] = 0.5
    assert remark.remark("digits_cell", root=repo, log=lambda *_: None) == 0
    entry = freshness.load_marks(repo)[rel]
    assert sorted(entry["files"]) == ["configs/digits_cell.yaml", "train.py", "vispe/attention.py"]
    assert entry["smoke"] == spec and "2 smoke runs" in entry["evidence"] and a[:7] in entry["evidence"]
    assert states(repo) == {"digits_cell.csv": "stale, marked"}
    with pytest.raises(ValueError, match="name='nope'"):
        remark.remark("nope", root=repo)


def test_effort_counts_runs_once_across_their_evaluation_rows(tmp_path):
    f = tmp_path / "t.csv"  # two runs, each evaluated at two sizes (its wall time on both rows)
    f.write_text("run,eval_size,wall_s,commit\na,16,1800,c\na,32,1800,c\nb,16,5400,c\nb,32,5400,c\n")
    assert freshness.effort(f) == "2 runs, 2.0 h wall"
    g = tmp_path / "g.csv"  # no run column: a variant evaluated from the same checkpoint counts once
    g.write_text("encoding,seed,variant,eval_size,train_time_s,commit\n"
                 "rope,0,none,16,3600,c\nrope,0,pi,16,3600,c\nrope,1,none,16,1800,c\n")
    assert freshness.effort(g) == "2 runs, 1.5 h training"
    h = tmp_path / "h.csv"
    h.write_text("acc,commit\n0.5,c\n")
    assert freshness.effort(h) == "-"


def test_a_csv_of_the_table3_recipe_follows_its_config_not_the_default(repo):
    """issue 39: DETR Table 3's recipe moved from configs/shapes_detr.yaml to shapes_detr_table3.yaml; the
    sweeps of results/compare/run_detr_*.sh (shapes_detr*.csv) use the latter, the five-minute default not."""
    (repo / "configs" / "shapes_detr_table3.yaml").write_text("a: 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "table3")
    head = git(repo, "rev-parse", "HEAD")
    write_csv(repo, "shapes_detr.csv", [head])
    write_csv(repo, "shapes_detr_init.csv", [head])
    commit_change(repo, "configs/shapes_detr.yaml")  # the default's schedule changes: not these runs'
    assert states(repo) == {"shapes_detr.csv": "fresh", "shapes_detr_init.csv": "fresh"}
    commit_change(repo, "configs/shapes_detr_table3.yaml")
    assert states(repo) == {"shapes_detr.csv": "STALE, NOT MARKED", "shapes_detr_init.csv": "STALE, NOT MARKED"}


def test_remark_compares_each_run_against_its_rows_commits_not_the_marks(repo, monkeypatch):
    """--remark's default: each smoke run of encoding ``pe`` against the commits of the CSV's rows of ``pe``
    (the commits its ``head`` pins are written against), not the commit the old mark was made at."""
    import remark
    import same_numbers

    a = git(repo, "rev-parse", "HEAD")
    b = commit_change(repo, "vispe/detr.py")
    c = commit_change(repo, "vispe/attention.py")
    rel = "results/compare/data/digits_cell.csv"
    (repo / rel).write_text(f"run,encoding,acc,commit\nsine_seed0,sine,0.5,{a}\nrope_seed0,rope,0.5,{b}\n"
                            f"rope_seed1,rope,0.5,{a}\n")
    spec = {"config": "configs/digits_cell.yaml", "runs": [{"pe": "sine"}, {"pe": "rope"}, {"pe": "other"}]}
    (repo / freshness.MARKS).write_text(json.dumps({rel: {"commits": [a, b], "reason": "why", "smoke": spec,
                                                          "at": c}}))
    asked: list[tuple[str, str]] = []

    def numbers(tree, config, pe, overrides, out, imports=None):
        if imports is not None:
            imports.write_text(json.dumps([str(repo / "vispe" / "attention.py")]))
        else:
            asked.append((pe, tree.name))
        return {"acc": 0.5 if imports is not None or (pe, tree.name) != ("rope", b) else 0.25}

    monkeypatch.setattr(same_numbers, "snapshot", lambda sha: repo / "runs" / sha)
    monkeypatch.setattr(same_numbers, "numbers", numbers)
    logged: list[str] = []
    assert remark.remark("digits_cell", root=repo, log=logged.append) == 1  # rope differs from b's numbers
    assert asked == [("sine", a), ("rope", b), ("rope", a), ("other", a), ("other", b)]  # no rows: every commit
    assert f"rope ({b[:7]})" in logged[-1] and "files" not in freshness.load_marks(repo)[rel]
    asked.clear()
    assert remark.remark("digits_cell", against=c, root=repo, log=logged.append) == 0  # an explicit --against: all runs
    assert asked == [("sine", c), ("rope", c), ("other", c)]
    assert f"at {c[:7]} and " in freshness.load_marks(repo)[rel]["evidence"]
    assert f"--against {c[:7]}" in freshness.load_marks(repo)[rel]["evidence"]
    (repo / rel).write_text(f"run,encoding,acc,commit\nsine_seed0,sine,0.5,{a}+dirty\n")
    with pytest.raises(ValueError, match=r"pe='sine'.*\+dirty.*--against"):
        remark.remark("digits_cell", root=repo, log=logged.append)
