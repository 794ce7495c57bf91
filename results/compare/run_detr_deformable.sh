#!/usr/bin/env bash
# Issue 36 on the embedded shapes set at DETR Table 3's budget (configs/shapes_deformable_detr.yaml:
# multi-scale Deformable DETR, 4 levels from the single-scale rows' own small CNN, 16 epochs): Deformable
# DETR plain, with box refinement, two-stage, and DAB's anchors on the deformable decoder (DINO's query
# formulation), 3 seeds each; then the same four without the level embedding (detr.level_pe=none),
# 3 seeds. Each group of four runs (a seed of the four rows, with or without the level embedding)
# holds the shared lock once (LOCK, default /work/heavy.lock; one run at a time, two threads per run);
# finished points are skipped, seed 0 of every row first, so that a partial run still has every row.
#
#   bash results/compare/run_detr_deformable.sh          # from the repository root
#   python -m vispe.report runs/sweeps/shapes_deformable_detr && python results/compare/update.py
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_deformable_detr}
LOCK=${LOCK:-/work/heavy.lock}
sweep() { $PY -m vispe.sweep --config configs/shapes_deformable_detr.yaml --out "$OUT" --threads 2 --pe sine "$@"; }
ROWS=("detr.decoder=deformable" "detr.decoder_kwargs={with_box_refine: true}"
      "detr.decoder_kwargs={with_box_refine: true, two_stage: true}" "detr.decoder=dab")
if [ "${1:-}" = "--group" ]; then  # one group, inside the lock: --group SEED [extra --vary]
  seed=$2; shift 2
  for row in "${ROWS[@]}"; do sweep --vary "$row" "$@" --seeds "$seed"; done
  exit 0
fi
locked() { if [ -e "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
mkdir -p "$(dirname "$OUT")"
for seed in 0 1 2; do locked bash "$0" --group "$seed"; done
for seed in 0 1 2; do locked bash "$0" --group "$seed" --vary detr.level_pe=none; done
echo "deformable sweep done: $OUT"
