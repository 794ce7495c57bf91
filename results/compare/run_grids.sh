#!/usr/bin/env bash
# The result grids of results/compare/*.md, one train.py run at a time on one CPU thread.
#
#   bash results/compare/run_grids.sh            # from the repository root; hours on a 2-core CPU
#
# Every command is a vispe.sweep invocation: finished points are skipped and interrupted ones
# resume from their checkpoints, so running this script again continues where it stopped (in
# another session too, as long as runs/sweeps/ is there). Phases are ordered so that a partial
# run is still useful: the two cheap position tasks (10 epochs) first with all seeds and CPVT's
# padding ablation (peg, padding_mode=none), then seed 0 of the 30-epoch tasks (digits_class:
# the resolution-transfer encodings first), then the rest of the registry, then seeds 1-2.
# The runs of results/compare were made from a snapshot of one commit, so that edits of the
# checkout during the hours they take cannot change them:
#   sha=$(git rev-parse --short HEAD); mkdir -p runs/_code/$sha
#   git archive HEAD | tar -x -C runs/_code/$sha; git rev-parse HEAD > runs/_code/$sha/.vispe-commit
#   PY=$PWD/.venv/bin/python OUT=$PWD/runs/sweeps nohup bash runs/_code/$sha/results/compare/run_grids.sh > runs/grids.log 2>&1 &
# Results: runs/sweeps/<task>/results.csv; tables: python -m vispe.report runs/sweeps/<task>.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/sweeps}  # where the sweep folders go
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
MAIN=none,sine,learned_abs,sincos2d,rope_axial,rope_mixed,relbias,peg
REST=learned_rowcol,axis2d,normidx2d,fourier,relbias_axis,irpe,log_cpb
TASKS="digits_cell digits_relative digits_content_position digits_class"
EVAL="train.eval_sizes=[0.5,0.75,1.0,1.25,1.5,2.0]"

sweep() {  # sweep <task> <args...>
  local task=$1; shift
  $PY -m vispe.sweep --config configs/$task.yaml --out $OUT/$task --threads 1 "$@" "$EVAL"
}

PEGNONE="--pe peg --vary model.pe_kwargs.padding_mode=none"
for t in digits_cell digits_relative; do sweep $t --pe $MAIN --seeds 0; sweep $t $PEGNONE --seeds 0; done
for t in digits_cell digits_relative; do sweep $t --pe $MAIN --seeds 0,1,2; sweep $t $PEGNONE --seeds 0,1,2; done
sweep digits_content_position --pe $MAIN --seeds 0; sweep digits_content_position $PEGNONE --seeds 0
sweep digits_class --pe none,learned_abs,rope_axial,rope_mixed --seeds 0   # resolution transfer first
sweep digits_class --pe $MAIN --seeds 0; sweep digits_class $PEGNONE --seeds 0
for t in $TASKS; do sweep $t --pe $REST --seeds 0; done
for t in digits_content_position digits_class; do sweep $t --pe $MAIN --seeds 0,1,2; sweep $t $PEGNONE --seeds 0,1,2; done
echo "all grids done"
