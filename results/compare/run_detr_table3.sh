#!/usr/bin/env bash
# Item 2 of results/compare: DETR's Table 3 on the embedded shapes set, 5 placements x 3 seeds
# (and a sixth, sine at every attention layer with the queries at the input, to separate the two),
# configs/shapes_detr_table3.yaml (16 epochs; configs/shapes_detr.yaml until issue 39). Two lanes of one-thread runs side by side (the
# two cores of the machine); finished points are skipped and interrupted ones resume, so running
# this again continues where it stopped.
#
#   bash results/compare/run_detr_table3.sh                  # from the repository root
#   python -m vispe.report runs/sweeps/shapes_detr && python results/compare/update.py
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_detr}
# DETR's own design, losses and sine, pinned: the recipe defaults to DAB-DETR with
# Plain-DETR's box bias and a temperature-20 sine (issue 25); model.pe_kwargs={} restores each
# encoding's own settings (sine: temperature 10000). tests/test_compare_scripts.py checks the pins.
DETR="detr.decoder=detr detr.box_bias=null task.weight_ce=1 task.cost_class=1 model.pe_kwargs={}"
sweep() { $PY -m vispe.sweep --config configs/shapes_detr_table3.yaml --out "$OUT" --threads 1 "$@" $DETR; }
row1() { sweep --pe none --vary detr.query_pos_at=input --seeds "$1"; }                       # no position
row2() { sweep --pe sine --vary detr.pe_at=input --vary detr.query_pos_at=input --seeds "$1"; } # sine at input
row3() { sweep --pe learned_rowcol --seeds "$1"; }                                             # learned at attn.
row4() { sweep --pe sine --vary "detr.pe_at={encoder: none, decoder: attn, queries: attn}" --seeds "$1"; }
row5() { sweep --pe sine --seeds "$1"; }                                                       # DETR's default
row6() { sweep --pe sine --vary detr.query_pos_at=input --seeds "$1"; }  # not in DETR: row 5 with row 1's queries
# seed 0 of every row first, so that a partial run still has all five rows
( row5 0; row1 0; row3 0; row5 1; row1 1; row3 1; row5 2; row1 2 ) > "${OUT}_lane1.log" 2>&1 &
( row2 0; row4 0; row2 1; row4 1; row3 2; row2 2; row4 2 ) > "${OUT}_lane2.log" 2>&1 &
wait
( row6 0; row6 1 ) > "${OUT}_lane1.log" 2>&1 &
( row6 2 ) > "${OUT}_lane2.log" 2>&1 &
wait
echo "Table 3 sweep done: $OUT"
