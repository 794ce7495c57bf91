#!/usr/bin/env bash
# Issue 35 on the embedded shapes set at DETR Table 3's budget (configs/shapes_detr_table3.yaml, which
# was configs/shapes_detr.yaml when these runs started: DAB-DETR +
# BoxRPB, 16 epochs): the papers' initialisation (detr.init=papers, the default since issue 35) against
# vispe's before it (detr.init=legacy), and Relation-DETR's box-to-box relation on top of the default
# (detr.query_relation=relation), 3 seeds each. One run at a time, two threads each; the three runs
# of a seed hold the shared lock together when there is one (LOCK, default /work/heavy.lock; about
# 35 minutes); finished points are skipped, seed 0 of every row first, so that a partial run still
# has every row.
#
#   bash results/compare/run_detr_init_relation.sh          # from the repository root
#   python -m vispe.report runs/sweeps/shapes_detr_init && python -m vispe.report runs/sweeps/shapes_detr_init_1thread
#   python results/compare/update.py
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_detr_init}
LOCK=${LOCK:-/work/heavy.lock}
sweep() { $PY -m vispe.sweep --config configs/shapes_detr_table3.yaml --out "$OUT" --threads 2 --pe sine "$@"; }
seed_rows() {
  sweep --vary detr.init=papers --seeds "$1"
  sweep --vary detr.init=legacy --seeds "$1"
  sweep --vary detr.query_relation=relation --seeds "$1"
}
export -f sweep seed_rows
export PY OUT
mkdir -p "$(dirname "$OUT")"
for seed in 0 1 2; do
  if [ -e "$LOCK" ]; then flock "$LOCK" bash -c "seed_rows $seed"; else seed_rows "$seed"; fi
done
# the papers' initialisation at one thread, beside Table 3's BoxRPB row (vispe's previous initialisation,
# one thread: run_detr_table3.sh); a run's numbers depend on the thread count (same_numbers.md)
one_thread() { $PY -m vispe.sweep --config configs/shapes_detr_table3.yaml --out "${OUT}_1thread" --threads 1 --pe sine \
                 --vary detr.init=papers --seeds 0,1,2; }
export -f one_thread
if [ -e "$LOCK" ]; then flock "$LOCK" bash -c one_thread; else one_thread; fi
echo "initialisation and relation sweep done: $OUT"
