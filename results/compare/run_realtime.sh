#!/usr/bin/env bash
# Issue 48 on the embedded shapes set (results/compare/detr_realtime.md), one torch thread per run, two lanes:
# RT-DETR (configs/shapes_rtdetr.yaml) with AIFI's sin-cos (sincos2d, mask-aware, as the config) and with
# rope_mixed in its place, into OUT; D-FINE (configs/shapes_dfine.yaml: FDR, LQE, FGL + DDF) into OUT_DFINE;
# 3 seeds each, every run evaluated at 0.75x / 1x / 1.5x the training size (train.eval_sizes). Seeds 0 of
# every row before seeds 1 and 2; finished points are skipped, so the script resumes where it stopped.
# (On the shared machine each point ran as its own `/work/bin/lane` call, in this order.)
#
#   bash results/compare/run_realtime.sh      # from the repository root
#   python results/compare/update.py          # vispe.report of both sweep folders, CSVs, pages
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps/shapes_rtdetr}
OUT_DFINE=${OUT_DFINE:-$(dirname "$OUT")/shapes_dfine}
rtdetr() { $PY -m vispe.sweep --config configs/shapes_rtdetr.yaml --threads 1 --out "$OUT" --pe "$1" --seeds "$2"; }
dfine() { $PY -m vispe.sweep --config configs/shapes_dfine.yaml --threads 1 --out "$OUT_DFINE" --pe sincos2d --seeds "$1"; }
mkdir -p "$(dirname "$OUT")"
( rtdetr sincos2d 0; rtdetr sincos2d 2; rtdetr rope_mixed 1; dfine 0; dfine 2 ) > "${OUT}_lane1.log" 2>&1 &
( rtdetr sincos2d 1; rtdetr rope_mixed 0; rtdetr rope_mixed 2; dfine 1 ) > "${OUT}_lane2.log" 2>&1 &
wait
echo "real-time DETR sweeps done: $OUT $OUT_DFINE"
