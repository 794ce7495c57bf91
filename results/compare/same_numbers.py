"""Does a results CSV's commit still give today's numbers? Run the same smoke trainings from a
snapshot of that commit and from this checkout, and compare their summaries exactly.

    python results/compare/same_numbers.py --old <sha> --config configs/digits_relative.yaml \
        --pe sine,rope_axial,relbias,learned_abs [override ...]

The snapshot is ``git archive <sha>`` (made under ``runs/_code/<sha>`` when missing). Each run is
``train.py --config ... --smoke model.pe=<pe> train.threads=1`` plus the overrides; the final train
loss, every evaluated accuracy and the step count must be equal to the last bit. Equal numbers on
the smoke runs show that the code path those runs take computes the same thing at both commits
(a check for marking a CSV whose commit differs from HEAD only in code its runs do not reach);
they do not replace a rerun when the numbers differ.
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


def numbers(tree: Path, config: str, pe: str, overrides: list[str], out: Path) -> dict:
    cmd = [sys.executable, str(tree / "train.py"), "--config", str(tree / config), "--smoke", f"model.pe={pe}",
           "train.threads=1", "train.compare=[]", "train.progress=false", f"train.out_dir={out}", "train.run_name=r",
           *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
    subprocess.run(cmd, check=True, cwd=tree, env=env, capture_output=True)
    s = json.loads((out / "r" / pe / "summary.json").read_text())
    return {"steps": s["steps"], "final": _numbers(s["final"]), "eval": _numbers(s.get("eval") or {})}


def _numbers(d: dict) -> dict:
    """``d`` without its clocks (times and throughputs differ run to run; the numbers must not)."""
    return {k: _numbers(v) if isinstance(v, dict) else v for k, v in d.items()
            if not (k.endswith("_time_s") or k.endswith("_s") or k in ("img_per_s", "peak_mem_mb"))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the commit a results CSV names")
    p.add_argument("--config", required=True)
    p.add_argument("--pe", required=True, help="comma-separated encodings")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    old = snapshot(a.old)
    same = True
    for pe in a.pe.split(","):
        with tempfile.TemporaryDirectory() as d:
            then = numbers(old, a.config, pe, a.overrides, Path(d) / "old")
            now = numbers(ROOT, a.config, pe, a.overrides, Path(d) / "new")
        ok = then == now
        same &= ok
        print(f"{pe:12s} {'same' if ok else 'DIFFERENT'}: {a.old[:7]} {json.dumps(then)} | HEAD {json.dumps(now)}",
              flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
