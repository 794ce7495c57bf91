#!/usr/bin/env bash
# Issue 36 on the embedded shapes set at DETR Table 3's budget (configs/shapes_deformable_detr.yaml:
# multi-scale Deformable DETR, 4 levels from the single-scale rows' own small CNN, 16 epochs): Deformable
# DETR plain, with box refinement, two-stage, and DAB's anchors on the deformable decoder (DINO's query
# formulation), 3 seeds each; then the same four without the level embedding (detr.level_pe=none), one
# seed. One run at a time through the shared lock when there is one (LOCK, default /work/heavy.lock),
# two threads per run; finished points are skipped, seed 0 of every row first, so that a partial run
# still has every row.
#
#   bash results/compare/run_detr_deformable.sh          # from the repository root
#   python -m vispe.report runs/sweeps/shapes_deformable_detr && python results/compare/update.py
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_deformable_detr}
LOCK=${LOCK:-/work/heavy.lock}
locked() { if [ -e "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
sweep() { locked $PY -m vispe.sweep --config configs/shapes_deformable_detr.yaml --out "$OUT" --threads 2 --pe sine "$@"; }
REFINE="detr.decoder_kwargs={with_box_refine: true}"
TWO="detr.decoder_kwargs={with_box_refine: true, two_stage: true}"
mkdir -p "$(dirname "$OUT")"
for seed in 0 1 2; do
  sweep --vary detr.decoder=deformable --seeds "$seed"
  sweep --vary "$REFINE" --seeds "$seed"
  sweep --vary "$TWO" --seeds "$seed"
  sweep --vary detr.decoder=dab --seeds "$seed"
done
for row in "detr.decoder=deformable" "$REFINE" "$TWO" "detr.decoder=dab"; do
  sweep --vary "$row" --vary detr.level_pe=none --seeds 0
done
echo "deformable sweep done: $OUT"
