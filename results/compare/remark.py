"""Re-mark a stale results CSV with new evidence: its smoke runs, equal to the last bit.

    .venv/bin/python results/compare/update.py --remark extrapolation_digits_cell [--against SHA]

The mark of ``data/<name>.csv`` in results/stale.json names its smoke variant (``smoke``: ``config``,
``old_config`` where the older commit named it otherwise, and ``runs``, each an encoding ``pe`` with
``overrides`` for both commits and ``head`` pins for this checkout only, see same_numbers.py).
Each smoke run is made from a snapshot of ``--against`` (default: the commits of the CSV's own rows
of that run's encoding, each one, else every commit of the CSV: the rows' commits are what the
``head`` pins restore, not the commit the old mark was made at) and from this checkout, which must
have no uncommitted change in the files it imports. Only when every number is equal to the last bit is a
new mark written: the evidence (what ran, where, when), HEAD, and the hashes of the files the runs
at this checkout imported (traced), of ``train.py`` and of the config. That mark expires when any
of those files changes (freshness.py). Nothing is written when a number differs: rerun the rows.
"""
from __future__ import annotations

import datetime
import json
import platform
import re
import subprocess
import tempfile
from pathlib import Path

import freshness
import pandas as pd
import same_numbers


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    except OSError:
        name = ""
    return name or platform.processor() or platform.machine()


def imported(files: list[str], root: Path) -> set[str]:
    """The traced module files that belong to this checkout (vispe/, train.py), as repository paths."""
    out = set()
    for f in files:
        p = Path(f).resolve()
        if p.is_relative_to(root) and not p.is_relative_to(root / ".venv"):
            out.add(p.relative_to(root).as_posix())
    return out


def row_commits(csv: Path, pe: str) -> list[str]:
    """The commits of ``csv``'s rows of encoding ``pe`` (every commit of the CSV when it has no such rows or no
    ``encoding`` column), in order of first appearance: what a smoke run of ``pe`` is compared against."""
    df = pd.read_csv(csv, usecols=lambda c: c in ("encoding", "commit"))
    if "commit" not in df:
        raise ValueError(f"csv={csv.name!r}: expected a commit column (the rows' commits); pass --against SHA")
    rows = df[df["encoding"].astype(str) == pe] if "encoding" in df else df.iloc[:0]
    commits = list(dict.fromkeys((rows if len(rows) else df)["commit"].dropna().astype(str)))
    dirty = [c for c in commits if not re.fullmatch(r"[0-9a-f]{7,40}", c)]
    if dirty or not commits:
        raise ValueError(f"csv={csv.name!r}, pe={pe!r}: rows' commits {dirty or commits!r}: expected clean commit "
                         "hashes (a run from uncommitted changes has no snapshot); pass --against SHA")
    return commits


def remark(name: str, against: str | None = None, root: Path = freshness.ROOT, log=print) -> int:
    csv = root / "results" / "compare" / "data" / f"{name}.csv"
    rel = csv.relative_to(root).as_posix()
    entry = freshness.load_marks(root).get(rel)
    if not csv.is_file():
        raise ValueError(f"name={name!r}: expected a CSV under results/compare/data/")
    if entry is None or "smoke" not in entry:
        raise ValueError(f"name={name!r}: its mark names no smoke variant (add 'smoke': {{config, pe, overrides, "
                         "head}} to its entry in results/stale.json, or rerun the rows)")
    spec = entry["smoke"]
    trees: dict[str, Path] = {}
    traced: set[str] = {"train.py", spec["config"]}
    diffs: list[str] = []
    olds: set[str] = set()
    added: set[str] = set()  # numbers only this checkout reports (a metric added since): not in the CSV's rows
    for run in spec["runs"]:
        what = " ".join([run["pe"], *run.get("overrides", [])])
        commits = [against] if against else row_commits(csv, run["pe"])
        with tempfile.TemporaryDirectory() as d:
            now = same_numbers.numbers(root, spec["config"], run["pe"], [*run.get("overrides", []), *run.get("head", [])],
                                       Path(d) / "new", imports=Path(d) / "imports.json")
            traced |= imported(json.loads((Path(d) / "imports.json").read_text()), root)
            for i, old in enumerate(commits):
                tree = trees.setdefault(old, same_numbers.snapshot(old))
                then = same_numbers.numbers(tree, spec.get("old_config", spec["config"]), run["pe"],
                                            run.get("overrides", []), Path(d) / f"old{i}")
                differ, new = same_numbers.compare(then, now)
                added |= set(new)
                olds.add(old[:7])
                log(f"{what:40s} {old[:7]} {'same' if not differ else 'DIFFERENT' + same_numbers._where(then, now)}"
                    + (f" (this checkout adds {', '.join(new)})" if new else ""))
                if differ:
                    diffs.append(f"{what} ({old[:7]})")
    old = " / ".join(sorted(olds))
    if diffs:
        log(f"{name}: not re-marked, {', '.join(diffs)} differ between {old} and this checkout: rerun the rows")
        return 1
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *sorted(traced)],
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        raise ValueError(f"uncommitted changes in files the runs import:\n{dirty}\ncommit them, then re-mark")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    pes = sorted({r["pe"] for r in spec["runs"]})
    evidence = (f"{len(spec['runs'])} smoke runs ({', '.join(pes)}; {spec['config']} --smoke, one thread) give the same numbers to "
                f"the last bit at {old} and {head[:7]}"
                + (f" ({head[:7]} also reports {', '.join(sorted({k.rsplit('.', 1)[-1] for k in added}))}, not in the rows)"
                   if added else "") + f" ({when}, {_cpu()}; "
                f"`python results/compare/update.py --remark {name}"
                + (f" --against {against[:7]}" if against else "") + "`)")
    files = {p: freshness.file_hash(root, p) for p in sorted(traced)}
    freshness.mark(rel, entry["reason"], root, evidence=evidence, files=files, extra={"smoke": spec})
    log(f"{name}: re-marked at {head[:7]}, {len(files)} imported files recorded")
    return 0
