#!/usr/bin/env bash
# Issue 21's contract end to end, one run at a time so each wall time is the machine's alone:
# pretrain zh-bert-small, fine-tune zh-sentiment from it and from random weights of the same
# architecture (two seeds each), score each run once on the test split, print the table.
#
#   bash benchmarks/classify/pretraining_pays.sh [RUNS_DIR]     # ~45 + 4 x 15 minutes on 2 cores
#   FINETUNE_SET="--set train.learning_rate=2e-3" bash benchmarks/classify/pretraining_pays.sh runs/lr2e-3
#   PRETRAINED=runs/zh-bert-small bash benchmarks/classify/pretraining_pays.sh   # reuse a pretraining
#
# A run that finished (its RUN.wall is on disk) is not run again, nor a test score on disk
# recomputed, so an interrupted benchmark is rerun with the same command (a half-finished run
# resumes from its checkpoint: its wall time then covers only the part after the restart, and
# the table says so).
set -euo pipefail
runs=${1:-runs/pretraining-pays}
pretrained=${PRETRAINED:-$runs/zh-bert-small}
read -r -a finetune_set <<< "${FINETUNE_SET:-}"
mkdir -p "$runs"

timed() {  # timed NAME COMMAND...: run it unless done, its log and wall seconds in RUNS_DIR
  local name=$1; shift
  [ -s "$runs/$name.wall" ] && return
  local start=$SECONDS resumed=""
  [ -d "$runs/$name/checkpoints" ] && resumed=" resumed"
  "$@" > "$runs/$name.log" 2>&1 || { echo "$name failed: see $runs/$name.log" >&2; exit 1; }
  echo "$((SECONDS - start))$resumed" > "$runs/$name.wall"
}

[ -n "${PRETRAINED:-}" ] || timed zh-bert-small trainformer train zh-bert-small --run-dir "$pretrained"

# Random weights, the same architecture: the pretrained run's encoder sizes, named explicitly.
read -r -a sizes <<< "$(python - "$pretrained/config.yaml" <<'EOF'
import sys, yaml
from trainformer.run_dir import ENCODER_KEYS
model = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))["model"]
print(" ".join(f"--set model.{key}={model[key]}" for key in ENCODER_KEYS))
EOF
)"

for seed in ${SEEDS:-42 7}; do
  timed pretrained-s$seed trainformer train zh-sentiment --run-dir "$runs/pretrained-s$seed" \
      --set model.init_from="$pretrained" --set train.seed=$seed "${finetune_set[@]}"
  timed random-s$seed trainformer train zh-sentiment --run-dir "$runs/random-s$seed" \
      --set train.seed=$seed "${sizes[@]}" "${finetune_set[@]}"
done

for run in pretrained random; do
  for seed in ${SEEDS:-42 7}; do  # the test split, once per run
    [ -s "$runs/$run-s$seed.test.json" ] || trainformer eval "$runs/$run-s$seed" --split test --json \
        > "$runs/$run-s$seed.test.json"
  done
done

python - "$runs" "$pretrained" ${SEEDS:-42 7} <<'EOF'
import json, sys
from pathlib import Path
runs, pretrained, seeds = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

def minutes(name):  # "12.3", "12.3 (resumed)", or "-" for a run this benchmark did not time
    wall = runs / f"{name}.wall"
    if not wall.is_file():
        return "-"
    seconds, *remark = wall.read_text().split()
    return f"{int(seconds) / 60:.1f}" + (f" ({' '.join(remark)})" if remark else "")

print(f"zh-bert-small ({pretrained}): {minutes('zh-bert-small')} minutes")
print(f"| zh-sentiment, test accuracy | {' | '.join(f'seed {s}' for s in seeds)} | mean | minutes |")
print("|---|" + "---:|" * (len(seeds) + 2))
for run in ("pretrained", "random"):
    scores = [json.loads((runs / f"{run}-s{s}.test.json").read_text())["accuracy"] for s in seeds]
    cells = " | ".join(f"{score:.2%}" for score in scores)
    print(f"| {run} | {cells} | {sum(scores) / len(scores):.2%} | {' / '.join(minutes(f'{run}-s{s}') for s in seeds)} |")
EOF
