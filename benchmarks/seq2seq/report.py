"""What a trained seq2seq run is worth: its valid BLEU against wall-clock minutes, its test
scores with beam search and with greedy search, decode speed with and without the key/value
cache, and (for summarization) the lead baseline on the same test split.

    python benchmarks/seq2seq/report.py runs/en-zh-translate
    python benchmarks/seq2seq/report.py runs/zh-headline --lead --json

Decode speed is sentences/s over the first --speed-examples test pairs, batched as eval batches
them, after one warm-up batch (tracing excluded); the uncached search runs the decoder on the
whole prefix at every step (model/search.py uncached_step), the reference the cache must equal.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainformer.data.parallel import load_parallel
from trainformer.tokens import PAD_ID
from trainformer.model import search
from trainformer.tasks.text_scores import text_scores
from trainformer.run.inference import load_run
from trainformer.run_dir import RunDir


def bleu_curve(run_dir: Path) -> list[dict]:
    """(minutes since the run started, step, valid BLEU) at every eval of the run."""
    run = RunDir(run_dir)
    started = datetime.datetime.fromisoformat(run.read_manifest()["started_at"]).timestamp()
    records = [json.loads(line) for line in run.metrics_file.read_text().splitlines()]
    return [{"minutes": round((r["time"] - started) / 60, 1), "step": r["step"], "bleu": round(r["bleu"], 2),
             "rougeL": round(r["rougeL"], 1)} for r in records if r.get("split") == "valid"]


def scores_with(task, model, split: str, **decode) -> dict:
    """The task's eval of a split with other decode settings (e.g. strategy="greedy")."""
    task.config = dataclasses.replace(task.config, decode=dataclasses.replace(task.config.decode, **decode))
    metrics = task.evaluator(model)(split)
    return {key: round(metrics[key], 2) for key in ("bleu", "chrf", "rouge1", "rouge2", "rougeL", "sentences_per_s")}


def decode_speed(task, model, split: str, examples: int) -> dict:
    """sentences/s of greedy and beam-4 search, with and without the cache."""
    batches, rows = [], 0
    for inputs, _ in task.eval_batches(split):
        batches.append(inputs["source_ids"])
        rows += len(batches[-1])
        if rows >= examples:
            break
    max_length = task.max_output
    results = {}
    for name, beam_size in (("greedy", None), ("beam4", 4)):
        for cache in (True, False):
            step = search.cached_step(model) if cache else search.uncached_step(model)

            @tf.function(reduce_retracing=True)
            def decode(source_ids):
                mask = source_ids != PAD_ID
                state = search.initial_state(model, source_ids, mask, max_length, cache)
                batch = tf.shape(source_ids)[0]
                if beam_size is None:
                    return search.greedy_search(step, state, batch, max_length)[0]
                return search.beam_search(step, state, batch, max_length, beam_size, 0.6)[0]

            decode(batches[0])  # trace
            started = time.perf_counter()
            for source_ids in batches:
                decode(source_ids).numpy()
            results[f"{name}_{'cached' if cache else 'uncached'}"] = round(rows / (time.perf_counter() - started), 1)
    return {"sentences": rows, **results}


def lead_baseline(task, split: str) -> dict:
    """The article's first characters as its headline, cut to the mean training headline length."""
    corpus = load_parallel(task.config.data.corpus, task.config.data.valid_fraction, task.config.data.test_fraction)
    length = round(np.mean([len(target) for target in corpus.train.targets]))
    pairs = getattr(corpus, split)
    scores = text_scores([source[:length] for source in pairs.sources], pairs.targets, corpus.target_language)
    return {"characters": length, **{key: round(value, 2) for key, value in scores.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--checkpoint", default="latest", choices=("latest", "best"))
    parser.add_argument("--speed-examples", type=int, default=64)
    parser.add_argument("--lead", action="store_true", help="also score the lead baseline (summarization)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    task, model, _, step = load_run(args.run_dir, args.checkpoint)
    report = {"run": str(args.run_dir), "step": step, "split": args.split, "valid_curve": bleu_curve(args.run_dir),
              "beam4": scores_with(task, model, args.split, strategy="beam", beam_size=4),
              "greedy": scores_with(task, model, args.split, strategy="greedy"),
              "decode_speed": decode_speed(task, model, args.split, args.speed_examples)}
    if args.lead:
        report["lead"] = lead_baseline(task, args.split)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
        return
    print(f"{args.run_dir} at step {step}, {args.split} split")
    for row in report["valid_curve"]:
        print(f"  {row['minutes']:6.1f} min  step {row['step']:6d}  valid BLEU {row['bleu']:6.2f}  ROUGE-L {row['rougeL']:5.1f}")
    for name in ("beam4", "greedy", "lead"):
        if name in report:
            print(f"  {name:7s} " + "  ".join(f"{key} {value}" for key, value in report[name].items()))
    print("  decode sentences/s: " + ", ".join(f"{k} {v}" for k, v in report["decode_speed"].items()))


if __name__ == "__main__":
    main()
