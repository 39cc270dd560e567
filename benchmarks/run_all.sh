#!/usr/bin/env bash
# trainformer against its peers on identical shapes, one after another in one invocation,
# then one table with ratios (report.py).
#   bash setup_venv.sh                                  # once: the peers' venv (~2.8 GB)
#   bash run_all.sh                                     # both shapes, ~25 min on 2 cores
#   CONFIGS=bert-mini-bench STEPS=10 bash run_all.sh    # quicker
# TF_PY: the Python of the venv where trainformer is installed (default: ../.venv/bin/python).
# Each run appends one JSON line to $OUT/results.jsonl; its log is in $OUT/logs/.
set -u
cd "$(dirname "$0")"
PY=${PY:-${VENV:-$HOME/.cache/trainformer-peers-venv}/bin/python}
TF_PY=${TF_PY:-../.venv/bin/python}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
CONFIGS=${CONFIGS:-"bert-mini-bench bert-small-bench"}
TEXT_CONFIGS=${TEXT_CONFIGS:-bert-mini-bench}    # real text: People's Daily, packed vs padded
BF16_CONFIGS=${BF16_CONFIGS:-bert-mini-bench}    # bf16 is 2-5x slower without AVX512-BF16: mini only
XLA_CONFIGS=${XLA_CONFIGS:-$CONFIGS}             # train.xla=on (auto is off on CPU)
TIMEOUT=${TIMEOUT:-1800}          # per run, seconds
export BENCH_TMP=${BENCH_TMP:-/tmp/trainformer-bench}
OUT=${OUT:-$BENCH_TMP/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs"
RES="$OUT/results.jsonl"

# Temp and cache files stay under $BENCH_TMP; nothing is downloaded at run time.
export TMPDIR=$BENCH_TMP/tmp XDG_CACHE_HOME=$BENCH_TMP/cache
export HF_HOME=$BENCH_TMP/cache/hf HF_HUB_OFFLINE=1
export TORCHINDUCTOR_CACHE_DIR=$BENCH_TMP/cache/inductor
export KERAS_BACKEND=tensorflow TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$TMPDIR" "$XDG_CACHE_HOME"

run() {  # run NAME PYTHON SCRIPT [ARGS...]   (config/steps/warmup/out are appended)
    local name=$1 py=$2; shift 2
    echo ">> $(date +%T) $cfg $name   load: $(cut -d' ' -f1-3 /proc/loadavg)"
    timeout "$TIMEOUT" "$py" "$@" --config "$cfg" --steps "$STEPS" --warmup "$WARMUP" \
        --out "$RES" >"$OUT/logs/$name-$cfg.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || echo "{\"kind\": \"fail\", \"peer\": \"$name\", \"config\": \"$cfg\", \"rc\": $rc}" >>"$RES"
}

bf16=$(grep -q -m1 -w avx512_bf16 /proc/cpuinfo && echo yes || echo no)
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), nproc=$(nproc), avx512_bf16=$bf16"
echo "== $(date -Is)  $machine  load: $(cut -d' ' -f1-3 /proc/loadavg)  out=$OUT" | tee "$OUT/machine.txt"
peak() {  # matmul peak with both frameworks; run before and after the peers, best one counts
    "$PY" peak_matmul.py --framework tf --out "$RES" >>"$OUT/logs/peak-tf.log" 2>&1
    "$PY" peak_matmul.py --framework torch --out "$RES" >>"$OUT/logs/peak-torch.log" 2>&1
}
peak

for cfg in $CONFIGS; do
    run trainformer-fp32   "$TF_PY" peer_trainformer.py
    run kerashub-jit0      "$PY" peer_kerashub.py --jit 0
    run hf-torch-eager     "$PY" peer_hf_torch.py --compile 0
done
for cfg in $TEXT_CONFIGS; do
    run trainformer-text   "$TF_PY" peer_trainformer.py --text 1 --docs-out "$OUT/docs-$cfg.npz"
    run kerashub-text      "$PY" peer_kerashub_text.py --docs "$OUT/docs-$cfg.npz"
done
for cfg in $XLA_CONFIGS; do
    run trainformer-xla    "$TF_PY" peer_trainformer.py --xla on
done
for cfg in $BF16_CONFIGS; do
    run trainformer-bf16   "$TF_PY" peer_trainformer.py --precision bf16
done

peak
echo "== done $(date -Is)  load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt"
"$PY" report.py "$RES" | tee "$OUT/table.txt"
