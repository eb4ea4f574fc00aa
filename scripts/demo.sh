#!/usr/bin/env bash
# The main job of the README quick start: profile a real torchvision model on this machine's CPU,
# compile its communication schedule for a default cluster (8 workers, 10 Gbps ring all-reduce,
# computation 30x faster than one CPU thread, i.e. a modest GPU), and compare it with every
# baseline policy side by side. On the CPU's own timings (seconds per iteration) communication
# hides entirely and every policy ties; the compute what-if keeps the profiled DAG, relative op
# costs and gradient sizes and only rescales time.
set -euo pipefail
BIN=${1:-.venv/bin}
OUT=${PACE_DEMO_OUT:-out/demo}
MODEL=${PACE_DEMO_MODEL:-torchvision:resnet18}
SPEEDUP=${PACE_DEMO_COMPUTE_SPEEDUP:-30}
mkdir -p "$OUT"
trace="$OUT/$(echo "$MODEL" | tr ':/' '__').trace.json.gz"
schedule="$OUT/$(echo "$MODEL" | tr ':/' '__').schedule.json"

echo "== 1/3 profile $MODEL (CPU, real iterations) -> $trace"
"$BIN/pace" profile --model "$MODEL" --batch-size 8 --iters 5 \
  --workers 8 --bandwidth-gbps 10 -o "$trace"
echo "== 2/3 compile for 8 workers, 10 Gbps, compute ${SPEEDUP}x faster -> $schedule"
"$BIN/pace" compile "$trace" -o "$schedule" --compute-speedup "$SPEEDUP"
echo "== 3/3 compare every policy with the compiled schedule (row 'schedule') on the same what-if"
"$BIN/pace" compare "$trace" --schedule "$schedule"
echo "== the schedule file replays to its prediction on the trace it was compiled from:"
"$BIN/pace" validate "$schedule" --trace "$trace"
