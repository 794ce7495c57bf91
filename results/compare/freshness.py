"""Is each results CSV from the code of today? Commits named by the CSVs against HEAD's history.

    .venv/bin/python results/compare/update.py --check                     # exit 1 on a stale, unmarked CSV
    .venv/bin/python results/compare/update.py --mark results/compare/data/X.csv --reason "why not rerun"

Every ``*.csv`` under ``results/`` with a ``commit`` column (one per row, written by vispe.sweep)
is **fresh** when each commit it names is an ancestor of HEAD and none of the files its runs use
differ between that commit and HEAD. Otherwise it is **stale**, and the check accepts it only when
``results/stale.json`` marks it: the mark records the commits it covers and why the table was not
rerun, so rows added later from another commit are judged again. A CSV without a ``commit`` column
is stale unless marked ("no commit recorded"); ``<name>_curves.csv`` is covered by ``<name>.csv``.

The files a run uses (a conservative rule, not a trace): ``train.py``, the task's
``configs/<task>.yaml`` (``CONFIG_OF`` where the CSV's runs used a config of another name, else the
longest config name within the CSV's name; every config when none matches) and every file under ``vispe/`` except the packages a training run never imports,
``EXCLUDED`` (analysis, probes, report, export, and the sweep launcher, which only starts train.py
and whose overrides the CSV records). tests/test_results_fresh.py checks that importing the rest of
vispe loads none of them. A commit that this repository does not have (history rewritten when it
landed, see results/compare/README.md) or that is not an ancestor of HEAD is stale: the code cannot
be compared. Only committed code counts (HEAD, not uncommitted edits of the checkout).
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
MARKS = "results/stale.json"
EXCLUDED = ("vispe/analysis", "vispe/probes", "vispe/report.py", "vispe/export.py", "vispe/sweep")
#: CSV name -> the config its runs use, where the names differ: DETR Table 3's 16-epoch recipe moved from
#: configs/shapes_detr.yaml (now a five-minute default) to configs/shapes_detr_table3.yaml (issue 39)
CONFIG_OF = {"shapes_detr": "shapes_detr_table3", "shapes_detr_queries": "shapes_detr_table3",
             "shapes_detr_init": "shapes_detr_table3", "shapes_detr_init_1thread": "shapes_detr_table3"}


@dataclass
class Verdict:
    csv: str  # path relative to the repository root
    commits: list[str]
    stale: dict[str, str]  # commit (or "-") -> why it is stale
    mark: str | None  # the recorded reason, when a mark covers every stale commit

    @property
    def state(self) -> str:
        return "fresh" if not self.stale else ("stale, marked" if self.mark else "STALE, NOT MARKED")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def run_files(root: Path, csv: Path) -> list[str]:
    """Git pathspecs of the files the runs of ``csv`` use (see the module docstring)."""
    configs = sorted(p.stem for p in (root / "configs").glob("*.yaml"))
    match = [CONFIG_OF[csv.stem]] if csv.stem in CONFIG_OF else [c for c in configs if c in csv.stem]
    cfg = [f"configs/{max(match, key=len)}.yaml"] if match else ["configs"]
    return ["train.py", *cfg, "vispe", *(f":(exclude){e}" for e in EXCLUDED)]


def commit_state(root: Path, commit: str, files: list[str]) -> str | None:
    """None when ``commit`` is fresh for ``files``, else why not."""
    if _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode != 0:
        return "not in this repository's history"
    if _git(root, "merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        return "not an ancestor of HEAD"
    diff = _git(root, "diff", "--name-only", commit, "HEAD", "--", *files)
    if diff.returncode != 0:
        raise RuntimeError(f"git diff failed: {diff.stderr.strip()}")
    changed = diff.stdout.split()
    return None if not changed else f"{len(changed)} file(s) changed since, e.g. {', '.join(changed[:3])}"


def load_marks(root: Path) -> dict:
    f = root / MARKS
    return json.loads(f.read_text()) if f.is_file() else {}


def csv_commits(csv: Path) -> list[str] | None:
    """The commits named by ``csv`` (in order of first appearance), None without a commit column."""
    cols = pd.read_csv(csv, nrows=0).columns
    if "commit" not in cols:
        return None
    return list(dict.fromkeys(pd.read_csv(csv, usecols=["commit"])["commit"].dropna().astype(str)))


def judge(root: Path, csv: Path, marks: dict) -> Verdict:
    rel = csv.relative_to(root).as_posix()
    commits = csv_commits(csv)
    if commits is None:
        stale = {"-": "no commit recorded"}
    else:
        files = run_files(root, csv)
        stale = {c: s for c in commits if (s := commit_state(root, c, files))}
    mark = marks.get(rel)
    covered = mark is not None and set(stale) <= set(mark.get("commits", [])) | ({"-"} if commits is None else set())
    return Verdict(rel, commits or [], stale, mark["reason"] if covered and stale else None)


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


def mark(csv: str, reason: str, root: Path = ROOT) -> dict:
    """Record in results/stale.json that ``csv``'s current commits are known stale, and why."""
    if not reason.strip():
        raise ValueError(f"reason={reason!r}: expected a sentence saying why the table was not rerun")
    path = (root / csv).resolve() if not Path(csv).is_absolute() else Path(csv)
    if not path.is_file() or path.suffix != ".csv":
        raise ValueError(f"csv={csv!r}: expected an existing .csv file under results/")
    marks = load_marks(root)
    entry = {"commits": csv_commits(path) or [], "reason": reason.strip()}
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


def markdown(verdicts: list[Verdict], root: Path = ROOT) -> str:
    """The provenance table for results/compare/README.md."""
    lines = ["| CSV | commit(s) | runs, summed time | state | why not rerun / what changed |",
             "|---|---|---|---|---|"]
    for v in verdicts:
        why = v.mark or "; ".join(f"{c[:7]}: {s}" for c, s in v.stale.items()) or "-"
        lines.append(f"| `{v.csv}` | {', '.join(c[:7] for c in v.commits) or '-'} | {effort(root / v.csv)} | "
                     f"{v.state} | {why} |")
    return "\n".join(lines)


def report(verdicts: list[Verdict]) -> tuple[str, int]:
    bad = [v for v in verdicts if v.stale and not v.mark]
    text = "\n".join(f"{v.state:18s} {v.csv}" + (f"  ({'; '.join(v.stale.values())})" if v.stale else "")
                     for v in verdicts)
    if bad:
        text += (f"\n{len(bad)} stale CSV(s) not marked: rerun them, or mark them with\n"
                 "  python results/compare/update.py --mark <csv> --reason '<why not rerun>'")
    return text, int(bool(bad))
