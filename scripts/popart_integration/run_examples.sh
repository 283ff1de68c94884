#!/bin/bash
# Graphcore's PopART feature examples (graphcore/tutorials at b7ffa4d, feature_examples/popart) and PopART's
# user-guide examples (docs/popart/files), unmodified, with the command lines their own tests and READMEs use.
#   TUT_DIR: an extract of graphcore/tutorials b7ffa4d (feature_examples/popart)   default /tmp/pit/tut
#   DOC_DIR: a copy of PopART's docs/popart/files                                 default /tmp/pit/docex
#   PY:      the Python to run them with (the user guide's import examples need torchvision and onnxscript)
#   OUT:     where each example's output goes (<name>.log)                         default /tmp/pit/examples_out
OUT=${OUT:-/tmp/pit/examples_out}; mkdir -p "$OUT"
PY=${PY:-python}
FE=${TUT_DIR:-/tmp/pit/tut}/feature_examples/popart
D=${DOC_DIR:-/tmp/pit/docex}
run() { name=$1; dir=$2; shift 2; start=$(date +%s)
  (cd "$dir" && ulimit -v 12000000 && timeout "${TMO:-900}" "$@") > "$OUT/$name.log" 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - start ))s"; }
run callbacks "$FE/callbacks" "$PY" callbacks.py --data-size 1000
run phased_execution "$FE/phased_execution" "$PY" phased_execution.py
run phased_execution_sharded "$FE/phased_execution" "$PY" phased_execution.py --sharded-execution
run pipelining "$FE/pipelining" "$PY" pipelining.py --test
run pipelining_off "$FE/pipelining" "$PY" pipelining.py --test --no_pipelining
run recomputing_on "$FE/recomputing" "$PY" recomputing.py --test --recomputing ON
run recomputing_off "$FE/recomputing" "$PY" recomputing.py --test --recomputing OFF
run recomputing_auto "$FE/recomputing" "$PY" recomputing.py --test --recomputing AUTO
run sharding "$FE/sharding" "$PY" multi_ipu.py --shards 2 --batch-size 10 --batches-per-step ${SHARDING_BPS:-1000}
for f in simple_addition weights importing_graphs importing_session executing_imported_model replication_popart; do
  run "guide_$f" "$D" "$PY" "$f.py"
done
