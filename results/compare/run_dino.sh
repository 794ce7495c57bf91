#!/usr/bin/env bash
# Issue 47 on the embedded shapes set (results/compare/detr_dino.md), one torch thread per run, two lanes:
#  1. at DETR Table 3's budget as the deformable rows use it (configs/shapes_dino.yaml: the deformable rows'
#     detector, 16 epochs): DINO, DINO without contrastive denoising (dn_number=0) and DINO without
#     look-forward-twice, 3 seeds each, into OUT (seeds 0 of every row before seeds 1 and 2); beside them DAB's
#     anchors on the deformable operator in DINO's query formulation (detr.decoder=dab with no decoder_kwargs:
#     no denoising, no mixed query selection, no look-forward-twice), 3 seeds, into OUT;
#  2. DINO at a shorter schedule (8 epochs), the candidate detection default (configs/shapes_detr.yaml),
#     3 seeds, into OUT_short; and at 10 epochs, seed 0, evaluated every 2 epochs (it ran as
#     `--seeds 0 train.epochs=10 train.eval_every=2`, folder sine_seed0, renamed in the CSV to this point's name).
# Finished points are skipped, so the script resumes where it stopped.
#
#   bash results/compare/run_dino.sh          # from the repository root
#   python results/compare/update.py          # vispe.report of both sweep folders, CSVs, pages
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_dino}
sweep() { $PY -m vispe.sweep --config configs/shapes_dino.yaml --threads 1 --pe sine "$@"; }
dino() { sweep --out "$OUT" --seeds "$1"; }
no_dn() { sweep --out "$OUT" --vary detr.decoder_kwargs.dn_number=0 --seeds "$1"; }
once() { sweep --out "$OUT" --vary detr.decoder_kwargs.look_forward_twice=false --seeds "$1"; }
dab() { sweep --out "$OUT" --vary detr.decoder=dab --seeds "$1" 'detr.decoder_kwargs={}'; }
short() { sweep --out "${OUT}_short" --vary train.epochs=8 --seeds "$1"; }
short10() { sweep --out "${OUT}_short" --vary train.epochs=10 --seeds "$1" train.eval_every=2; }
mkdir -p "$(dirname "$OUT")"
( dino 0; no_dn 0; short 0; dino 2; no_dn 1; once 2; dab 0; dab 2; short 2 ) > "${OUT}_lane1.log" 2>&1 &
( dino 1; once 0; short 1; once 1; no_dn 2; dab 1; short10 0 ) > "${OUT}_lane2.log" 2>&1 &
wait
echo "DINO sweeps done: $OUT ${OUT}_short"
