"""The project as one more peer: `trainformer bench` (the real Trainer step) on the shapes of
common.CONFIGS, run with the project's own Python (its venv, not the peers').

    python peer_trainformer.py --config bert-mini-bench [--precision bf16] [--xla on] [--text 1 --docs-out D.npz]

--text 1 times real text (People's Daily, packed windows) instead of random ids and writes the
tokenized training documents to --docs-out, so peer_kerashub_text.py pads the same documents
with the same vocabulary.
"""
import json
import os
from pathlib import Path

import common


def extra(p):
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--xla", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--text", type=int, default=0)
    p.add_argument("--docs-out", default=None)
    p.add_argument("--cache-dir", default=os.path.join(os.environ.get("BENCH_TMP", "/tmp/trainformer-bench"),
                                                       "trainformer-cache"))


args = common.parse_args(extra)

import numpy as np
import tensorflow as tf

import trainformer
from trainformer.config import load_config
from trainformer.tokens import CLS_ID, MASK_ID, PAD_ID, SEP_ID
from trainformer.ops.bench import bench, bench_run_dir
from trainformer.tasks import load_source
from trainformer.tasks.mlm import MaskedLMTask

# The shape from common.CONFIGS, as every peer builds it, over the bert-mini-bench config's
# data and tokenizer (BERT layout: post-LN, learned positions, tied head)
shape = common.CONFIGS[args.config]
sizes = {"d_model": "hidden", "num_layers": "layers", "num_heads": "heads", "dff": "intermediate", "dropout": "dropout"}
config = load_config("bert-mini-bench", [f"model.{key}={shape[name]}" for key, name in sizes.items()]
                     + [f"tokenizer.vocab_size={shape['vocab']}", f"train.precision={args.precision}", f"train.xla={args.xla}"])
cache = Path(args.cache_dir)
r = bench(config, steps=args.steps, warmup=args.warmup, synthetic=not args.text, cache_dir=cache)
print(json.dumps(r), flush=True)

if args.text and args.docs_out:
    task = MaskedLMTask(config)
    task.prepare(bench_run_dir(config, cache), load_source(config), say=lambda text: None)
    ids = task.tokenizer(tf.constant(task.corpus.train))  # (documents, None) ragged
    np.savez(args.docs_out, flat=ids.flat_values.numpy(), lengths=ids.row_lengths().numpy(),
             vocab_size=task.vocab_size, pad=PAD_ID, cls=CLS_ID, sep=SEP_ID, mask=MASK_ID)

mode = "text" if args.text else "synthetic"
res = dict(
    kind="train", peer=f"trainformer {args.precision}" + (f" xla={args.xla}" if args.xla != "auto" else "")
    + (" packed text" if args.text else "") + os.environ.get("PEER_SUFFIX", ""),
    config=args.config, mode=mode, batch=r["batch_size"], seq=r["seq_len"], steps=r["steps"],
    warmup=args.warmup, warmup_s=r["compile_s"], step_ms_median=r["step_ms"], step_ms_min=r["step_ms_p10"],
    step_ms_p10=r["step_ms_p10"], step_ms_p90=r["step_ms_p90"], tokens_per_s=r["tokens_per_s"],
    effective_tokens_per_s=r["effective_tokens_per_s"], model_gflop_per_step=r["model_gflop_per_step"],
    achieved_gflops=r["achieved_gflops"], peak_rss_mb=r["peak_memory_mb"], own_cores=r["own_cores"],
    other_cores=r["other_cores"], params=r["num_params"], threads="tf defaults",
    notes=f"trainformer {trainformer.__version__} ({os.path.dirname(trainformer.__file__)}) tf {tf.__version__}; "
          f"own peak {r['peak_gflops']}, own MFU {r['mfu']}, data-wait {r['data_wait_pct']}%, vocab {r['vocab_size']}",
    data_wait_pct=r["data_wait_pct"], loadavg=r["loadavg"],
)
line = json.dumps(res)
print("RESULT " + line, flush=True)
if args.out:
    with open(args.out, "a") as f:
        f.write(line + "\n")
