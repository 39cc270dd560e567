#!/usr/bin/env bash
# The GPU check of issue 12 (JAX on the GPU machine; no TensorFlow there), in two stages that each
# fit one device command (< 10 minutes):
#   bench    (~5 min on an H200): peak; KerasHub, this tree and the tree first measured on
#            2026-11-30 at BERT-base, batch 256 x 128; this tree and KerasHub at 64 x 512
#   compare  (~4 min): hlo_compare.py of the same three steps, with each kernel's time
# Here, first: the wheels and the old tree (README.md), then a dry run on CPU:
#   PY=/path/to/jax-venv/bin/python bash benchmarks/gpu/run.sh all --tiny
# There: OUT=$OUT bash benchmarks/gpu/run.sh bench; then ... run.sh compare   (or: run.sh all)
set -u
cd "$(dirname "$0")/../.."
STAGE=${1:-all}
OUT=${OUT:-benchmarks/gpu/out}
PY=${PY:-python3}
mkdir -p "$OUT"
SHAPE=(--layers 12 --hidden 768 --heads 12 --inter 3072)
LONG=(--batch 64 --seq 512)
STEPS=()
if [ "${2:-}" = "--tiny" ]; then
  SHAPE=(--layers 2 --hidden 64 --heads 2 --inter 128 --vocab 500 --batch 4 --seq 32)
  LONG=(--batch 2 --seq 64)
  STEPS=(--steps 3 --warmup 1)
else
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export KERAS_BACKEND=jax
bench() {  # one part per process: JAX preallocates the GPU's memory
  echo "== $*" >&2
  timeout 150 "$PY" benchmarks/gpu/gpu_bench.py "$@" "${STEPS[@]}" 2>>"$OUT/stderr.log" | tee -a "$OUT/results.jsonl"
}
if [ "$STAGE" = bench ] || [ "$STAGE" = all ]; then
  PEAK=()
  if [ "${2:-}" != "--tiny" ]; then
    PEAK=(--peak "$("$PY" benchmarks/gpu/gpu_bench.py peak | tee -a "$OUT/results.jsonl" \
                   | "$PY" -c "import json,sys; print(json.load(sys.stdin)['tflops'])")")
  fi
  bench kerashub "${SHAPE[@]}" "${PEAK[@]}"
  bench tfm "${SHAPE[@]}" "${PEAK[@]}"
  TRAINFORMER_SRC=.gpu-before/src bench tfm "${SHAPE[@]}" "${PEAK[@]}"
  bench tfm "${SHAPE[@]}" "${LONG[@]}" "${PEAK[@]}"
  bench kerashub "${SHAPE[@]}" "${LONG[@]}" "${PEAK[@]}"
fi
if [ "$STAGE" = compare ] || [ "$STAGE" = all ]; then
  echo "== hlo_compare" >&2
  timeout 420 "$PY" benchmarks/gpu/hlo_compare.py --peers tfm@.gpu-before/src,tfm,kerashub --profile 3 \
    --json "$OUT/hlo_compare.json" "${SHAPE[@]}" 2>>"$OUT/stderr.log" | tee "$OUT/hlo_compare.txt"
fi
