#!/usr/bin/env bash
# Our training step from two source trees beside KerasHub, in one invocation on one machine:
# did a change to the model code make the CPU faster or slower? (issue 12: "CPU speed does not regress")
#   git archive <rev> src | tar -x -C /tmp/before
#   BEFORE=/tmp/before/src bash before_after.sh            # bert-mini-bench, fp32 and bf16, ~10 min on 2 cores
# Needs the peers' venv (setup_venv.sh). Prints report.py's table; a row's peer names its tree.
set -u
cd "$(dirname "$0")"
PY=${PY:-${VENV:-$HOME/.cache/trainformer-peers-venv}/bin/python}
TF_PY=${TF_PY:-../.venv/bin/python}
BEFORE=${BEFORE:?BEFORE=path/to/an/older/src}
CONFIGS=${CONFIGS:-bert-mini-bench}
STEPS=${STEPS:-20} WARMUP=${WARMUP:-5}
export BENCH_TMP=${BENCH_TMP:-/tmp/trainformer-bench} KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2
OUT=${OUT:-$BENCH_TMP/results/before-after-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs" && RES="$OUT/results.jsonl"
bf16=$(grep -q -m1 -w avx512_bf16 /proc/cpuinfo && echo yes || echo no)
echo "== $(date -Is)  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), nproc=$(nproc), avx512_bf16=$bf16" \
    | tee "$OUT/machine.txt"
run() {  # run NAME PYTHON SCRIPT [ARGS...]
    local name=$1 py=$2; shift 2
    echo ">> $(date +%T) $cfg $name   load: $(cut -d' ' -f1-3 /proc/loadavg)"
    timeout 1800 "$py" "$@" --config "$cfg" --steps "$STEPS" --warmup "$WARMUP" --out "$RES" \
        >"$OUT/logs/$name-$cfg.log" 2>&1 || echo "{\"kind\": \"fail\", \"peer\": \"$name\", \"config\": \"$cfg\"}" >>"$RES"
}
"$PY" peak_matmul.py --framework tf --out "$RES" >>"$OUT/logs/peak.log" 2>&1
for cfg in $CONFIGS; do
    run kerashub-jit0 "$PY" peer_kerashub.py --jit 0
    for precision in fp32 bf16; do
        PEER_SUFFIX=" (before)" PYTHONPATH=$BEFORE run "trainformer-$precision-before" "$TF_PY" peer_trainformer.py --precision "$precision"
        PEER_SUFFIX=" (after)" run "trainformer-$precision-after" "$TF_PY" peer_trainformer.py --precision "$precision"
    done
done
"$PY" report.py "$RES" | tee "$OUT/table.txt"
