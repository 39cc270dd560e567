#!/usr/bin/env bash
# The GPU check of issue 12, one command, ~8 minutes on an H200 (JAX, no TensorFlow there):
# our model (this tree, and the tree first measured on 2026-11-30) beside KerasHub at BERT-base,
# batch 256 x 128 and 64 x 512, then the graph comparison with each kernel's time.
#   Here, first: the wheels and the old tree (see README.md), then a dry run on CPU:
#     KERAS_BACKEND=jax PY=/tmp/jaxenv/bin/python bash benchmarks/gpu/run.sh --tiny
#   There: bash benchmarks/gpu/run.sh        (results in $OUT, or benchmarks/gpu/out)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/gpu/out}
PY=${PY:-python3}
mkdir -p "$OUT"
SHAPE=(--layers 12 --hidden 768 --heads 12 --inter 3072)
LONG=(--batch 64 --seq 512)
if [ "${1:-}" = "--tiny" ]; then
  SHAPE=(--layers 2 --hidden 64 --heads 2 --inter 128 --vocab 500 --batch 4 --seq 32 --steps 3 --warmup 1)
  LONG=(--batch 2 --seq 64)
else
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
  PEAK=$("$PY" benchmarks/gpu/gpu_bench.py peak | tee -a "$OUT/results.jsonl" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['tflops'])")
  SHAPE+=(--peak "$PEAK")
fi
export KERAS_BACKEND=jax
bench() {  # one part per process: JAX preallocates the GPU's memory
  echo "== $*" >&2
  timeout 180 "$PY" benchmarks/gpu/gpu_bench.py "$@" 2>>"$OUT/stderr.log" | tee -a "$OUT/results.jsonl"
}
bench kerashub "${SHAPE[@]}"
bench tfm "${SHAPE[@]}"
TRAINFORMER_SRC=.gpu-before/src bench tfm "${SHAPE[@]}"
bench kerashub-nodrop "${SHAPE[@]}"
bench tfm-nodrop "${SHAPE[@]}"
bench tfm "${SHAPE[@]}" "${LONG[@]}"
bench kerashub "${SHAPE[@]}" "${LONG[@]}"
echo "== hlo_compare" >&2
timeout 240 "$PY" benchmarks/gpu/hlo_compare.py --peers tfm@.gpu-before/src,tfm,kerashub --profile 5 \
  --json "$OUT/hlo_compare.json" $(printf '%s ' "${SHAPE[@]}" | sed 's/--steps [0-9]* --warmup [0-9]*//; s/--peak [0-9.]*//') \
  2>>"$OUT/stderr.log" | tee "$OUT/hlo_compare.txt"
