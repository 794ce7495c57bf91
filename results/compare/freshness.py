"""Is each results CSV from the code of today? File contents at the CSVs' commits against this checkout.

    .venv/bin/python results/compare/update.py --check         # exit 1 on a stale CSV: unmarked, or its mark expired
    .venv/bin/python results/compare/update.py --remark NAME   # re-mark with new evidence (results/compare/remark.py)

Every ``*.csv`` under ``results/`` with a ``commit`` column (one per row, written by vispe.sweep)
is **fresh** when each commit it names is an ancestor of HEAD and every file its runs use has, in
this checkout (the working tree, so that a page regenerated before a commit already tells the truth
after it), the content it had at that commit. Otherwise it is **stale**, and the check accepts it
only while a mark in ``results/stale.json`` covers it. A mark is one of two kinds:

* **evidence** (``--remark``, or ``--mark`` with ``--evidence``): records, when it is made, the git
  blob hash of each file the runs import (the set a traced smoke run imported, or the conservative
  set below) and the evidence (smoke runs equal to the last bit, by a command). It **expires** as
  soon as any of those files changes: the check then fails, naming the file, until the rows are
  rerun or re-marked. A file newly imported can only come in through an edit of a file already
  imported, so the recorded set cannot miss a change silently.
* **record** (``--mark --record``): the rows are kept as the record of the commit they ran at (an
  old grid that a newer table is compared against); pages say so and quote them as that, not as
  today's. Records never expire.

Rows whose runs recorded the files they used (the sweep runs train.py through vispe.sweep.trace; update.py
writes ``<name>_code.json`` beside the CSV: per commit, each file's hash then) are judged by those files only, as
they are in this checkout: a change elsewhere in the package leaves them fresh, and a ``+dirty`` run is judged
too. The rule below is for rows without such a record.

A YAML config counts as changed only when its parsed content changes (``differs``): a header comment rewritten
(its "Expected result" pointing at the page, say) cannot move a run, so it leaves the tables fresh.

A CSV without a ``commit`` column is stale unless marked ("no commit recorded"); ``<name>_curves.csv``
is covered by ``<name>.csv``. The files a run uses for the fresh test (a conservative rule, not a trace):
``train.py``, the task's ``configs/<task>.yaml`` (``CONFIG_OF`` where the CSV's runs used a config of
another name, else the longest config name within the CSV's name; every config when none matches)
and every file under ``vispe/`` except ``EXCLUDED`` (packages a training run never imports:
tests/test_results_fresh.py checks it); for the probe runner's CSVs (``PROBES``), every file under ``vispe/``
except ``EXCLUDED`` but with ``vispe/probes``.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
MARKS = "results/stale.json"
EXCLUDED = ("vispe/analysis", "vispe/probes", "vispe/report.py", "vispe/export.py", "vispe/sweep")
#: CSV name -> the config its runs use, where the names differ: DETR Table 3's 16-epoch recipe moved from
#: configs/shapes_detr.yaml (now a five-minute default) to configs/shapes_detr_table3.yaml (issue 39)
CONFIG_OF: dict[str, str | tuple[str, ...]] = {
    "shapes_detr": "shapes_detr_table3", "shapes_detr_queries": "shapes_detr_table3",
    "shapes_detr_init": "shapes_detr_table3", "shapes_detr_init_1thread": "shapes_detr_table3",
    "relbias_init_vit": "digits_relative", "relbias_init_torch": "digits_relative",  # relbias on digits_relative
    "detr_backbones": ("shapes_detr", "shapes_detr_vit")}  # the small-CNN row and the ViT-backbone rows


#: CSVs written by ``python -m vispe.probes.runner`` (no train.py, no config): their runs use vispe/ with its probes
PROBES = ("padding_leakage",)


NO_HASHES = "(the mark holds no file hashes: made before issue 53, it cannot tell what changed since)"


@dataclass
class Verdict:
    csv: str  # path relative to the repository root
    commits: list[str]
    stale: dict[str, str]  # commit (or "-") -> why it is stale
    mark: str | None  # the recorded reason, when a valid mark covers every stale commit
    expired: list[str] = field(default_factory=list)  # files changed since the mark covering it was made
    record: bool = False  # the mark keeps the rows as the record of their commit
    evidence: str = ""  # the mark's evidence
    note: str = ""  # why it stays STALE (``note``: e.g. its smoke differs, and from which commit)

    @property
    def state(self) -> str:
        if not self.stale:
            return "fresh"
        if self.record:
            return "record"
        if self.mark:
            return "stale, marked"
        return "STALE, MARK EXPIRED" if self.expired else "STALE, NOT MARKED"

    @property
    def ok(self) -> bool:
        return not self.state.startswith("STALE")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def blob(data: bytes) -> str:
    """git's blob hash of ``data`` (``git hash-object``): equal to the hash at a commit iff the content is."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_hash(root: Path, rel: str) -> str:
    f = root / rel
    return blob(f.read_bytes()) if f.is_file() else "deleted"


def _blob_text(root: Path, sha: str) -> str | None:
    out = _git(root, "cat-file", "-p", sha)
    return out.stdout if out.returncode == 0 else None


def differs(root: Path, path: str, then: str | None, now: str | None) -> bool:
    """Whether ``path`` changed between the blob hashes ``then`` and ``now`` in a way a run could see: a
    YAML config whose parsed content is equal (only comments, e.g. its header's "Expected result", or
    layout changed) has not; every other change of hash has."""
    if then == now:
        return False
    if then is None or now is None or now == "deleted" or not path.endswith((".yaml", ".yml")):
        return True
    old, new = _blob_text(root, then), ((root / path).read_text() if file_hash(root, path) == now
                                        else _blob_text(root, now))
    if old is None or new is None:
        return True
    try:
        return yaml.safe_load(old) != yaml.safe_load(new)
    except yaml.YAMLError:
        return True


def _config(root: Path, csv: Path) -> list[str]:
    if csv.stem in CONFIG_OF:
        named = CONFIG_OF[csv.stem]
        return [f"configs/{c}.yaml" for c in ((named,) if isinstance(named, str) else named)]
    match = [c for c in sorted(p.stem for p in (root / "configs").glob("*.yaml")) if c in csv.stem]
    return [f"configs/{max(match, key=len)}.yaml"] if match else ["configs"]


def run_files(root: Path, csv: Path) -> list[str]:
    """The paths (files or folders) whose files the runs of ``csv`` use (see the module docstring)."""
    return ["vispe"] if csv.stem in PROBES else ["train.py", *_config(root, csv), "vispe"]


def _used(path: str, csv: Path | None = None) -> bool:
    excluded = [e for e in EXCLUDED if not (csv is not None and csv.stem in PROBES and e == "vispe/probes")]
    return not any(path == e or path.startswith(e + "/") for e in excluded) and "__pycache__" not in path


def tree_files(root: Path, csv: Path) -> dict[str, str]:
    """The run files of ``csv`` in this checkout (tracked or new, not ignored) -> blob hash."""
    out = _git(root, "ls-files", "--cached", "--others", "--exclude-standard", "--", *run_files(root, csv))
    return {p: file_hash(root, p) for p in sorted(set(out.stdout.split())) if _used(p, csv) and (root / p).is_file()}


def commit_files(root: Path, commit: str, csv: Path) -> dict[str, str]:
    out = _git(root, "ls-tree", "-r", commit, "--", *run_files(root, csv))
    if out.returncode != 0:
        raise RuntimeError(f"git ls-tree failed: {out.stderr.strip()}")
    rows = (line.split(None, 3) for line in out.stdout.splitlines())
    return {r[3]: r[2] for r in rows if len(r) == 4 and _used(r[3], csv)}


def changed(then: dict[str, str], now: dict[str, str], root: Path | None = None) -> list[str]:
    """The paths whose hash differs; with ``root``, a YAML file equal once parsed is not counted (``differs``)."""
    return sorted(p for p in then.keys() | now.keys() if then.get(p) != now.get(p)
                  and (root is None or differs(root, p, then.get(p), now.get(p))))


DIRTY = "+dirty"  # vispe.sweep.provenance's suffix: the run had uncommitted changes in tracked files


def short(commit: str) -> str:
    """``commit`` as pages show it: seven hex digits, and ``+dirty`` where the run had uncommitted changes."""
    return commit[:7] + (DIRTY if commit.endswith(DIRTY) else "")


def commit_state(root: Path, commit: str, csv: Path, now: dict[str, str]) -> str | None:
    """None when ``commit`` is fresh (its run files equal ``now``'s), else why not."""
    if commit.endswith(DIRTY):  # the commit exists, the code the run used does not: no file can be compared
        base = commit[: -len(DIRTY)]
        known = _git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").returncode == 0
        return (f"ran from uncommitted changes on top of {base[:7]}"
                + ("" if known else f" ({base[:7]} is not in this repository's history)")
                + ": the files it used are unknown, rerun it from a commit (or mark it)")
    if _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode != 0:
        return "not in this repository's history"
    if _git(root, "merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return "not an ancestor of HEAD"
    diff = changed(commit_files(root, commit, csv), now, root)
    return None if not diff else f"{len(diff)} file(s) changed since: {', '.join(diff[:4])}" + (" ..." if len(diff) > 4 else "")


def traced(csv: Path) -> dict[str, dict[str, str] | None]:
    """``<name>_code.json`` beside ``csv`` (update.py, from the runs' imports.json): per commit, the files its
    runs used and their hashes then; empty when its runs were not traced."""
    f = csv.with_name(csv.stem + "_code.json")
    return json.loads(f.read_text()) if f.is_file() else {}


def traced_state(root: Path, files: dict[str, str]) -> str | None:
    """None when every file the runs used is as it was (this checkout), else which changed. Whatever the commit
    (an older one, a +dirty one): the content is what the runs ran."""
    diff = sorted(p for p, h in files.items() if differs(root, p, h, file_hash(root, p)))
    return None if not diff else (f"{len(diff)} file(s) its runs used changed since: {', '.join(diff[:4])}"
                                  + (" ..." if len(diff) > 4 else ""))


def load_marks(root: Path) -> dict:
    f = root / MARKS
    return json.loads(f.read_text()) if f.is_file() else {}


def csv_commits(csv: Path) -> list[str] | None:
    """The commits named by ``csv`` (in order of first appearance), None without a commit column."""
    cols = pd.read_csv(csv, nrows=0).columns
    if "commit" not in cols:
        return None
    return list(dict.fromkeys(pd.read_csv(csv, usecols=["commit"])["commit"].dropna().astype(str)))


def expired_files(root: Path, entry: dict) -> list[str]:
    """The files recorded by a mark whose content changed since (empty: the mark holds)."""
    if entry.get("record"):
        return []
    files = entry.get("files")
    if not files:
        return [NO_HASHES]
    return sorted(p for p, h in files.items() if differs(root, p, h, file_hash(root, p)))


def judge(root: Path, csv: Path, marks: dict) -> Verdict:
    rel = csv.relative_to(root).as_posix()
    commits = csv_commits(csv)
    if commits is None:
        stale = {"-": "no commit recorded"}
    else:
        code, now = traced(csv), None
        stale: dict[str, str] = {}
        for c in commits:
            if isinstance(code.get(c), dict):  # the runs recorded what they used (vispe.sweep.trace)
                s = traced_state(root, code[c])
            else:
                now = tree_files(root, csv) if now is None else now
                s = commit_state(root, c, csv, now)
            if s:
                stale[c] = s
    entry = marks.get(rel)
    covers = entry is not None and bool(stale) and set(stale) <= set(entry.get("commits", [])) | (
        {"-"} if commits is None else set())
    if not covers:
        return Verdict(rel, commits or [], stale, None, note=(entry or {}).get("note", "") if stale else "")
    expired = expired_files(root, entry)
    return Verdict(rel, commits or [], stale, None if expired else entry["reason"], expired,
                   bool(entry.get("record")), entry.get("evidence", ""))


def tables(root: Path) -> list[Path]:
    """Every results CSV that names (or should name) its commit; ``X_curves.csv`` goes with ``X.csv``."""
    out = []
    for f in sorted((root / "results").rglob("*.csv")):
        if f.stem.endswith("_curves") and f.with_name(f.stem[: -len("_curves")] + ".csv").is_file():
            continue
        out.append(f)
    return out


def check(root: Path = ROOT) -> list[Verdict]:
    marks = load_marks(root)
    return [judge(root, f, marks) for f in tables(root)]


def _csv_path(csv: str, root: Path) -> Path:
    path = (root / csv).resolve() if not Path(csv).is_absolute() else Path(csv)
    if not path.is_file() or path.suffix != ".csv":
        raise ValueError(f"csv={csv!r}: expected an existing .csv file under results/")
    return path


def mark(csv: str, reason: str, root: Path = ROOT, *, evidence: str = "", record: bool = False,
         files: dict[str, str] | None = None, extra: dict | None = None) -> dict:
    """Record in results/stale.json why ``csv``'s current commits are not rerun. An evidence mark stores
    the hashes of ``files`` (default: every run file of the CSV, in this checkout) and expires when one
    changes; a record mark (``record=True``) keeps the rows as the record of their commits."""
    if not reason.strip():
        raise ValueError(f"reason={reason!r}: expected a sentence saying why the table was not rerun")
    if not record and not evidence.strip():
        raise ValueError(f"evidence={evidence!r}: expected what shows the rows still hold (e.g. smoke runs "
                         "equal to the last bit, and the command), or record=True for a record of old code")
    path = _csv_path(csv, root)
    head = _git(root, "rev-parse", "HEAD").stdout.strip()
    entry: dict = {"commits": csv_commits(path) or [], "reason": " ".join(reason.split())}
    if record:
        entry["record"] = True
    else:
        entry.update(evidence=" ".join(evidence.split()), at=head,
                     date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                     files=dict(sorted((files if files is not None else tree_files(root, path)).items())))
    entry.update(extra or {})
    marks = load_marks(root)
    marks[path.relative_to(root).as_posix()] = entry
    (root / MARKS).write_text(json.dumps(dict(sorted(marks.items())), indent=1) + "\n")
    return entry


def note(csv: str, text: str, root: Path = ROOT) -> dict:
    """Say in results/stale.json why ``csv`` stays STALE (e.g. "its smoke differs from <commit> on: ..."); the
    check and the pages show it beside what changed. It covers nothing: the CSV stays STALE until rerun or
    re-marked (the entry's smoke variant and reason are kept; its expired evidence and hashes are dropped)."""
    if not text.strip():
        raise ValueError(f"text={text!r}: expected why the table stays stale (what differs, from which commit)")
    path = _csv_path(csv, root)
    marks = load_marks(root)
    kept = {k: v for k, v in marks.get(path.relative_to(root).as_posix(), {}).items() if k in ("reason", "smoke")}
    entry = {**kept, "commits": [], "note": " ".join(text.split())}  # the smoke spec stays for a later --remark
    marks[path.relative_to(root).as_posix()] = entry
    (root / MARKS).write_text(json.dumps(dict(sorted(marks.items())), indent=1) + "\n")
    return entry


RUN_KEYS = ("task", "data", "backbone", "encoding", "variant", "pe_kwargs", "padding", "input", "target",
            "level", "seed", "commit")  # the columns that name one run (rows are per evaluation size)


def effort(csv: Path) -> str:
    """Runs in ``csv`` and their summed time: ``wall_s`` per run, else the training or probe time."""
    cols = pd.read_csv(csv, nrows=0).columns
    time = next((c for c in ("wall_s", "train_time_s", "seconds") if c in cols), None)
    keys = [c for c in (("run", "task", "data", "commit") if "run" in cols else RUN_KEYS) if c in cols]
    if time is None or not keys:
        return "-"
    df = pd.read_csv(csv, usecols=keys + [time])
    if "run" in cols:
        per_run = df.groupby(keys, dropna=False)[time].max()
    else:  # no run name: one training per distinct (keys, time); a variant evaluated from the same
        # checkpoint (rope_scaling's scalings) repeats its run's training time and counts once
        per_run = df.drop_duplicates([k for k in keys if k not in ("variant", "pe_kwargs")] + [time])[time]
    noun, what = {"wall_s": ("run", "wall"), "train_time_s": ("run", "training"), "seconds": ("probe", "fitting")}[time]
    return f"{len(per_run)} {noun}{'s' * (len(per_run) != 1)}, {per_run.sum() / 3600:.1f} h {what}"


def explain(v: Verdict) -> str:
    """One sentence: why ``v`` is in its state (for the pages and the check's output)."""
    if v.state == "fresh":
        return "every file its runs use is as it was at the CSV's commit(s)"
    if v.state == "record":
        return f"kept as the record of {', '.join(short(c) for c in v.commits) or 'its commit'}, not as today's code: {v.mark}"
    if v.state == "stale, marked":
        return f"{v.mark.rstrip('.')}. Evidence: {v.evidence}"
    note = f"{v.note.rstrip('.')}; " if v.note else ""
    if v.expired and v.expired != [NO_HASHES]:
        return note + "code changed since the mark's evidence: " + ", ".join(v.expired)
    return note + "code changed since these runs: " + "; ".join(f"{short(c)}: {s}" for c, s in v.stale.items())


def status_line(v: Verdict) -> str:
    """The line a results page prints above the tables of ``v``'s CSV."""
    name = f"`{v.csv.removeprefix('results/compare/')}`"
    head = {"fresh": "fresh", "record": "a record of old code", "stale, marked": "marked (not rerun, with evidence)"}
    return f"**Status of {name}** (written by `update.py`): " + (
        f"{head[v.state]}: {explain(v)}" if v.ok else f"**STALE**: {explain(v).rstrip('.')}.")


def markdown(verdicts: list[Verdict], root: Path = ROOT) -> str:
    """The provenance table for results/compare/README.md."""
    lines = ["| CSV | commit(s) | runs, summed time | state | why not rerun, evidence / what changed |",
             "|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(f"| `{v.csv}` | {', '.join(short(c) for c in v.commits) or '-'} | {effort(root / v.csv)} | "
                     f"{v.state} | {explain(v)} |")
    return "\n".join(lines)


def report(verdicts: list[Verdict]) -> tuple[str, int]:
    bad = [v for v in verdicts if not v.ok]
    text = "\n".join(f"{v.state:19s} {v.csv}" + ("" if v.ok else f"  ({explain(v)})")
                     for v in verdicts)
    if bad:
        text += (f"\n{len(bad)} stale CSV(s): rerun them, or re-mark them with new evidence:\n"
                 "  python results/compare/update.py --remark <csv name>   (smoke runs, results/compare/remark.py)")
    return text, int(bool(bad))
