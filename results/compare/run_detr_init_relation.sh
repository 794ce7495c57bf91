#!/usr/bin/env bash
# Issue 35 on the embedded shapes set at DETR Table 3's budget (configs/shapes_detr.yaml: DAB-DETR +
# BoxRPB, 16 epochs): the papers' initialisation (detr.init=papers, the default since issue 35) against
# vispe's before it (detr.init=legacy), and Relation-DETR's box-to-box relation on top of the default
# (detr.query_relation=relation), 3 seeds each. One run at a time through the shared lock when there is
# one (LOCK, default /work/heavy.lock), two threads per run; finished points are skipped, seed 0 of
# every row first, so that a partial run still has every row.
#
#   bash results/compare/run_detr_init_relation.sh          # from the repository root
#   python -m vispe.report runs/sweeps/shapes_detr_init && python results/compare/update.py
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_detr_init}
LOCK=${LOCK:-/work/heavy.lock}
locked() { if [ -e "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
sweep() { locked $PY -m vispe.sweep --config configs/shapes_detr.yaml --out "$OUT" --threads 2 --pe sine "$@"; }
mkdir -p "$(dirname "$OUT")"
for seed in 0 1 2; do
  sweep --vary detr.init=papers --seeds "$seed"
  sweep --vary detr.init=legacy --seeds "$seed"
  sweep --vary detr.query_relation=relation --seeds "$seed"
done
echo "initialisation and relation sweep done: $OUT"
