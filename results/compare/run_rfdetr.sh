#!/usr/bin/env bash
# Issue 49 on the embedded shapes set (results/compare/detr_vit.md), one torch thread per run, two chains:
# an RF-DETR-style detector (configs/shapes_rfdetr.yaml: a small windowed ViT, the C2f projector, Group-DETR
# two-stage queries, a deformable decoder) trained at NATIVE ASPECT with padding masks; the same trained on
# SQUARE-RESIZED images (data.train_augment=square, which is configs/shapes_rfdetr_square.yaml); and native
# aspect with the DINOv2-style table replaced by rope_mixed. Every row is evaluated at native aspect. 3 seeds
# each into OUT, seeds 0 of every row before seeds 1 and 2. LANE (e.g. LANE=/work/bin/lane, a machine-wide
# slot script) prefixes every single run, so that a shared machine's slots are taken one run at a time.
# Finished points are skipped, so the script resumes where it stopped.
#
#   LANE=/work/bin/lane bash results/compare/run_rfdetr.sh     # from the repository root
#   python results/compare/update.py                           # vispe.report of the sweep folder, CSV, page
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_rfdetr}
LANE=${LANE:-}
sweep() { $LANE $PY -m vispe.sweep --config configs/shapes_rfdetr.yaml --threads 1 --out "$OUT" "$@"; }
native() { sweep --pe learned_abs --seeds "$1"; }
square() { sweep --pe learned_abs --vary data.train_augment=square --seeds "$1"; }
rope() { sweep --pe rope_mixed --seeds "$1"; }
mkdir -p "$(dirname "$OUT")"
( native 0; square 1; native 2; rope 2 ) > "${OUT}_lane1.log" 2>&1 &
( square 0; rope 0; native 1; rope 1; square 2 ) > "${OUT}_lane2.log" 2>&1 &
wait
echo "RF-DETR sweeps done: $OUT"
