"""DETR on the shapes set: the small CNN vs a vispe ViT backbone (issue 26).

Reads the ViT runs (``runs/vit_seed*/summary.json``, from the commands in
``results/compare/detr_backbones.md``) and the small CNN's rows of ``data/shapes_detr.csv``
(DETR Table 3's default row: sine at every attention layer), writes
``data/detr_backbones.csv`` and prints the markdown table.

    python results/compare/detr_backbones.py [RUNS_DIR]
"""
from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(runs: Path) -> None:
    rows = []
    with open(HERE / "data" / "shapes_detr.csv") as f:
        for r in csv.DictReader(f):
            if (r["encoding"] == "sine" and r["eval_size"] == "64" and not r["detr.pe_at"]
                    and not r["detr.query_pos_at"] and r["status"] == "finished"):
                rows.append(dict(backbone="small_cnn", seed=int(r["seed"]), AP=float(r["AP"]), AP50=float(r["AP50"]),
                                 params=int(r["params"]), train_time_s=float(r["train_time_s"]),
                                 commit=r["commit"][:7]))
    for path in sorted(runs.glob("vit_seed*/summary.json")):
        d = json.loads(path.read_text())
        if not d.get("finished"):
            continue
        e = d["encodings"]["sine"]
        cfg = (path.parent / "config.yaml").read_text()
        seed = int(path.parent.name.removeprefix("vit_seed"))
        rows.append(dict(backbone="vit_pico (rope_mixed, patch 8)", seed=seed, AP=e["eval"]["64"]["AP"],
                         AP50=e["eval"]["64"]["AP50"], params=e["params"], train_time_s=e["train_time_s"],
                         commit="f380dd1"))
        assert "vit_pico" in cfg
    with open(HERE / "data" / "detr_backbones.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("| backbone | AP @64px | AP50 @64px | seeds | params | train time per run |")
    print("|---|---|---|---|---|---|")
    for name in dict.fromkeys(r["backbone"] for r in rows):
        sel = [r for r in rows if r["backbone"] == name]

        def fmt(k):
            v = [r[k] for r in sel]
            return f"{statistics.mean(v):.3f} ± {statistics.stdev(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"
        t = [r["train_time_s"] for r in sel]
        print(f"| {name} | {fmt('AP')} | {fmt('AP50')} | {len(sel)} ({', '.join(str(r['seed']) for r in sel)}) | "
              f"{sel[0]['params'] / 1e6:.2f}M | {min(t):.0f}-{max(t):.0f} s |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs"))
