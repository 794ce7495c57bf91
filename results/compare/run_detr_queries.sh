#!/usr/bin/env bash
# DETR's Table 3 on the embedded shapes set, continued: positioned object queries (issue 25).
# configs/shapes_detr_table3.yaml's budget (16 epochs, same model size, data, optimiser) with the query
# designs of vispe.models.detr.design.designs; the positioned designs use their papers' focal loss weights
# (classification 2, matching cost 2). Two lanes of one-thread runs; finished points are skipped.
#
#   bash results/compare/run_detr_queries.sh                 # from the repository root
#   python -m vispe.report runs/sweeps/shapes_detr_queries && python results/compare/update.py
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_detr_queries}
# every row ran before issue 35 made the papers' initialisation the default: detr.init=legacy keeps theirs
FOCAL="task.weight_ce=2 task.cost_class=2 detr.init=legacy"
# the recipe defaults to DAB-DETR + BoxRPB with a temperature-20 sine: every row but
# BoxRPB's pins the box bias off, and Conditional DETR keeps the sine's own temperature (10000)
NOBIAS="detr.box_bias=null"
mkdir -p "$(dirname "$OUT")"
sweep() { $PY -m vispe.sweep --config configs/shapes_detr_table3.yaml --out "$OUT" --threads 1 "$@"; }
cond() { sweep --pe sine --vary detr.decoder=conditional --seeds "$1" $FOCAL $NOBIAS model.pe_kwargs={}; }
dab() { sweep --pe sine --vary detr.decoder=dab --seeds "$1" $FOCAL $NOBIAS model.pe_kwargs.temperature=20; }
boxrpb() { sweep --pe sine --vary detr.decoder=dab --vary detr.box_bias=boxrpb --seeds "$1" $FOCAL model.pe_kwargs.temperature=20; }
# the rows with 2D RoPE in the cross-attention (detr.dec_pe=rope_axial / rope_mixed) were removed from
# the table (issue 53: they do not reproduce at today's code); git history (1e280b4) has their lines
# seed 0 of every row first, so that a partial run still has every row
( cond 0; boxrpb 0; cond 1; boxrpb 1; cond 2 ) > "${OUT}_lane1.log" 2>&1 &
( dab 0; dab 1; dab 2; boxrpb 2 ) > "${OUT}_lane2.log" 2>&1 &
wait
echo "positioned-query sweep done: $OUT"
