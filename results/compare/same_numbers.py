"""Does a results CSV's commit still give today's numbers? Run the same smoke trainings from a
snapshot of that commit and from this checkout, and compare their summaries exactly.

    python results/compare/same_numbers.py --old <sha> --config configs/digits_relative.yaml \
        --pe sine,rope_axial,relbias,learned_abs [override ...]
    python results/compare/same_numbers.py --old d894cd3 --config configs/shapes_detr.yaml --pe sine \
        --head "detr.decoder=detr detr.box_bias=null task.weight_ce=1 task.cost_class=1 model.pe_kwargs={}"

The snapshot is ``git archive <sha>`` (made under ``runs/_code/<sha>`` when missing). Each run is
``train.py --config ... --smoke model.pe=<pe> train.threads=1`` plus the overrides; the final train
loss, every evaluated accuracy and the step count must be equal to the last bit. Equal numbers on
the smoke runs show that the code path those runs take computes the same thing at both commits
(a check for marking a CSV whose commit differs from HEAD only in code its runs do not reach);
they do not replace a rerun when the numbers differ. ``--head`` adds overrides at HEAD only: the
pins that restore a config default changed since ``--old`` (keys the old commit may not know).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def snapshot(sha: str) -> Path:
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", sha], capture_output=True, text=True,
                          check=True).stdout.strip()
    out = ROOT / "runs" / "_code" / full[:7]
    if not (out / "train.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", full], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
        (out / ".vispe-commit").write_text(full)
    return out


#: runs a script as ``__main__`` and, at exit, writes the files of every module it imported to $VISPE_IMPORTS
TRACE = ("import atexit, json, os, runpy, sys\n"
         "def _dump():\n"
         "    files = sorted({str(getattr(m, '__file__', None)) for m in list(sys.modules.values())} - {'None'})\n"
         "    open(os.environ['VISPE_IMPORTS'], 'w').write(json.dumps(files))\n"
         "atexit.register(_dump)\n"
         "sys.argv = sys.argv[1:]\n"
         "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def numbers(tree: Path, config: str, pe: str, overrides: list[str], out: Path, imports: Path | None = None) -> dict:
    """The smoke run's numbers; with ``imports``, the files of the modules it imported are written there."""
    script = [str(tree / "train.py"), "--config", str(tree / config), "--smoke", f"model.pe={pe}",
              "train.threads=1", "train.compare=[]", "train.progress=false", f"train.out_dir={out}", "train.run_name=r",
              *overrides]
    cmd = [sys.executable, *(["-c", TRACE] if imports else []), *script]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree), **({"VISPE_IMPORTS": str(imports)} if imports else {})}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"smoke run failed ({' '.join(script[:4])} ... {pe}): {done.stderr[-1500:]}")
    s = json.loads((out / "r" / pe / "summary.json").read_text())
    return {"steps": s["steps"], "final": _numbers(s["final"]), "eval": _numbers(s.get("eval") or {})}


def _numbers(d: dict) -> dict:
    """``d`` without its clocks (times and throughputs differ run to run; the numbers must not)."""
    return {k: _numbers(v) if isinstance(v, dict) else v for k, v in d.items()
            if not (k.endswith("_time_s") or k.endswith("_s") or k in ("img_per_s", "peak_mem_mb"))}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _equal(a, b) -> bool:
    """Equal to the last bit; a NaN equals a NaN (e.g. AP of a size class no box falls in, at both commits)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _not_a_score(key: str, value) -> bool:
    """COCOeval's -1.0 for an AP key ("no object of this kind among the images", e.g. APl on the shapes set): not
    a score, left out of the metrics since 4339485, so an older run's -1.0 there is the same as no number."""
    return key.rsplit(".", 1)[-1].removeprefix("test_").startswith("AP") and value == -1.0  # final.test_APl too


def compare(then: dict, now: dict) -> tuple[list[str], list[str]]:
    """(the numbers of ``then`` that differ at ``now`` or are gone there, the numbers only ``now`` has), as dotted
    keys. The old run's numbers are what its CSV rows hold: a metric this checkout adds (e.g. a new column) leaves
    them equal, and is named apart; an AP of -1.0 that this checkout leaves out is no number (``_not_a_score``)."""
    a, b = _flat(then), _flat(now)
    differ = [k for k in a if (k not in b and not _not_a_score(k, a[k])) or (k in b and not _equal(a[k], b[k]))]
    return sorted(differ), sorted(b.keys() - a.keys())


def _where(then: dict, now: dict) -> str:
    """Which numbers differ and by how much (relative), e.g. `` (4 numbers, largest 1e-07 at eval.64.loss)``."""
    a, b = _flat(then), _flat(now)
    diff = {k: (a.get(k), b.get(k)) for k in compare(then, now)[0]}
    if not diff:
        return ""
    rel = {k: abs(x - y) / max(abs(x), abs(y), 1e-12) if isinstance(x, float) and isinstance(y, float) else float("inf")
           for k, (x, y) in diff.items()}
    worst = max(rel, key=rel.get)
    named = ", ".join(sorted(diff)[:4]) + (" ..." if len(diff) > 4 else "")
    return f" ({len(diff)} numbers, largest relative difference {rel[worst]:.1e} at {worst}; {named})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the commit a results CSV names")
    p.add_argument("--config", required=True)
    p.add_argument("--pe", required=True, help="comma-separated encodings")
    p.add_argument("--head", default="", help="space-separated overrides for HEAD only (defaults changed since --old)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    old = snapshot(a.old)
    same = True
    for pe in a.pe.split(","):
        with tempfile.TemporaryDirectory() as d:
            then = numbers(old, a.config, pe, a.overrides, Path(d) / "old")
            now = numbers(ROOT, a.config, pe, [*a.overrides, *a.head.split()], Path(d) / "new")
        differ, added = compare(then, now)
        ok = not differ
        same &= ok
        extra = f" (this checkout adds {', '.join(added)})" if added else ""
        print(f"{pe:12s} {'same' + extra if ok else 'DIFFERENT' + _where(then, now)}: {a.old[:7]} {json.dumps(then)} | "
              f"HEAD {json.dumps(now)}", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
