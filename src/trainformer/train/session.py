"""Masked-LM pretraining end to end: corpus -> vocabulary -> packed windows -> train -> eval.

`pretrain` is what `trainformer train` runs; `evaluate` is what `trainformer eval` runs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainformer.config import ExperimentConfig
from trainformer.data.corpus import Corpus, load_corpus
from trainformer.data.pipeline import (
    cache_file, cached_token_stream, distribute, eval_batches, most_frequent_token, pack, train_dataset,
)
from trainformer.data.tokenizer import VOCAB_FILE, Tokenizer, copy_vocab, train_vocab
from trainformer.errors import TrainingError, UserError
from trainformer.model.heads import build_masked_lm
from trainformer.train.attention import AttentionSnapshot, sentence_from_windows
from trainformer.train.checkpoint import Checkpoints, find_checkpoint, restore_model, weights_digest
from trainformer.train.loop import Evaluator, Trainer
from trainformer.train.monitor import Monitor, format_duration
from trainformer.train.optim import make_optimizer
from trainformer.train.prometheus import PrometheusExporter
from trainformer.train.run_dir import RunDir, environment, now
from trainformer.train.strategy import (
    barrier, configure_devices, describe_devices, is_chief, is_multi_worker, make_strategy,
)

DTYPE_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
EVAL_SEED = 20260101  # fixed: every eval of every run scores the same valid targets


@dataclass
class Data:
    """Everything a run needs from its corpus."""

    corpus: Corpus
    tokenizer: Tokenizer
    train_windows: np.ndarray  # (num_windows, seq_len) int32
    valid_windows: np.ndarray
    baseline_id: int  # the most frequent training token
    was_cached: bool


def prepare_data(config: ExperimentConfig, run: RunDir, say=print, corpus: Corpus | None = None,
                 train_vocabulary: bool = True) -> Data:
    """Load the corpus (unless given), train the vocabulary (once per run) and pack tokenized
    windows (cached).

    train_vocabulary=False (non-chief workers): the run's vocabulary must exist already.
    """
    corpus = corpus or load_corpus(config.data.corpus, config.data.valid_fraction)
    say(f"corpus: {corpus.summary()}")
    tok = config.tokenizer
    if (run.tokenizer_dir / VOCAB_FILE).is_file():
        pass  # a run keeps its vocabulary: token ids must not change under a checkpoint
    elif not train_vocabulary:
        raise UserError(f"{run.root}: the chief's vocabulary is not there; the run directory must be on "
                        f"storage every worker sees")
    elif tok.vocab_file:
        say(f"vocabulary: {copy_vocab(tok.vocab_file, run.tokenizer_dir, tok.lowercase)} (from {tok.vocab_file})")
    else:
        started = time.perf_counter()
        train_vocab(corpus.train, run.tokenizer_dir, tok.vocab_size, tok.min_frequency, tok.lowercase)
        say(f"vocabulary: trained in {time.perf_counter() - started:.1f}s -> {run.tokenizer_dir / VOCAB_FILE}")
    tokenizer = Tokenizer.load(run.tokenizer_dir)
    streams = {}
    was_cached = True
    for split, documents in (("train", corpus.train), ("valid", corpus.valid)):
        streams[split], cached = cached_token_stream(run.cache_dir, tokenizer, documents, corpus.fingerprint, split)
        was_cached &= cached
    seq_len = config.data.seq_len
    train_windows = pack(streams["train"], seq_len)
    if len(train_windows) < config.train.batch_size:
        raise UserError(
            f"train.batch_size: {config.train.batch_size} is more than the {len(train_windows)} "
            f"training windows of data.seq_len={seq_len} in {corpus.source}"
        )
    return Data(corpus, tokenizer, train_windows, pack(streams["valid"], seq_len),
                most_frequent_token(streams["train"]), was_cached)


def build_model(config: ExperimentConfig, vocab_size: int) -> keras.Model:
    return build_masked_lm(config.model, vocab_size, config.data.seq_len, dtype=DTYPE_POLICIES[config.train.precision])


def build_trainer(config: ExperimentConfig, vocab_size: int, strategy: tf.distribute.Strategy) -> Trainer:
    """The model, AdamW and Trainer of config, created under strategy (what train and bench run)."""
    t = config.train
    with strategy.scope():
        model = build_model(config, vocab_size)
        optimizer = make_optimizer(t.learning_rate, min(t.warmup_steps, t.steps), t.steps, t.weight_decay)
    return Trainer(model, optimizer, strategy, t)


def pretrain(config: ExperimentConfig, run: RunDir, corpus: Corpus, out=sys.stdout,
             exporter: PrometheusExporter | None = None) -> dict:
    """Train (or resume) a masked-LM run in run and return the final valid metrics
    ({"step", "stopped_by"} instead when SIGTERM or Ctrl-C stopped it early). The caller has
    checked and locked the run directory (train/start.py).

    With several workers every process runs this; only the chief writes run, which must
    be on storage all workers see (they read its vocabulary, token cache and checkpoints).
    """
    configure_devices(config.runtime)
    strategy = make_strategy(config.train.strategy)  # first: the multi-worker runtime must start before any op
    chief = is_chief(strategy)
    say = (lambda text: print(text, file=out, flush=True)) if chief else (lambda text: None)  # noqa: E731
    with contextlib.ExitStack() as cleanup:
        # Non-chief workers write their checkpoints and logs to a scratch folder, deleted at exit.
        writes = run if chief else RunDir(Path(cleanup.enter_context(tempfile.TemporaryDirectory())))
        log = out if chief else cleanup.enter_context(open(os.devnull, "w"))
        return _pretrain(config, run, corpus, writes, strategy, say, log, exporter)


def _pretrain(config: ExperimentConfig, run: RunDir, corpus: Corpus, writes: RunDir, strategy: tf.distribute.Strategy,
              say, out, exporter: PrometheusExporter | None) -> dict:
    chief = writes == run
    train_cfg = config.train
    if chief:
        run.prepare(config)
    check_batch_split(train_cfg.batch_size, strategy.num_replicas_in_sync)
    keras.utils.set_random_seed(train_cfg.seed)  # Python, NumPy and TF seeds: model init, dropout
    if train_cfg.deterministic:
        # Deterministic kernels; our own jit_compile functions keep XLA (DESIGN.md).
        tf.config.experimental.enable_op_determinism()
    data = prepare_data(config, run, say, corpus) if chief else None
    barrier(strategy)  # the chief has written the vocabulary and token cache: the others read them
    data = data or prepare_data(config, run, say, corpus, train_vocabulary=False)

    trainer = build_trainer(config, data.tokenizer.vocab_size, strategy)
    model = trainer.model
    checkpoints = Checkpoints(writes.checkpoints_dir, train_cfg.keep_checkpoints, **trainer.checkpoint_objects())
    shared = checkpoints if chief else Checkpoints(run.checkpoints_dir, 1, **trainer.checkpoint_objects())
    restored = shared.restore_latest(warn=say)
    start_step = int(trainer.step.numpy())

    def batches_from(number: int):
        return iter(distribute(strategy, train_dataset(
            data.train_windows, train_cfg.batch_size, train_cfg.seed, config.data.mask_rate,
            data.tokenizer.vocab_size, start_batch=number,
        )))

    valid = eval_batches(data.valid_windows, train_cfg.batch_size, EVAL_SEED, config.data.mask_rate,
                         data.tokenizer.vocab_size)
    manifest = start_manifest(writes, config, data, model.count_params(), strategy, bool(restored), start_step)
    tokens_per_step = train_cfg.accumulate * train_cfg.batch_size * config.data.seq_len
    if exporter:
        say(f"metrics: {exporter.url}")
    # Records past the restored step belong to steps that are trained again: drop them.
    monitor = Monitor(writes.metrics_file, writes.logs_dir, train_cfg.steps, tokens_per_step, out, exporter,
                      start_step=start_step)
    print_summary(say, config, data, model.count_params(), strategy, run)
    if restored:
        say(f"resuming from checkpoint {restored} (step {start_step}/{train_cfg.steps})")
        monitor.record({"event": "resume", "step": start_step, "checkpoint": restored, "time": time.time()})
    if start_step >= train_cfg.steps:
        say(f"nothing left to train: step {start_step} >= train.steps {train_cfg.steps} "
            f"(to train longer: {run.resume_command()} --set train.steps=N)")

    attention = AttentionSnapshot(model, data.tokenizer, *sentence_from_windows(data.valid_windows),
                                  layer=train_cfg.attention_layer)
    started = time.perf_counter()
    try:
        final = trainer.fit(batches_from, valid, data.baseline_id, monitor, checkpoints,
                            on_eval=attention.log if chief else None)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError) as err:
        if not is_multi_worker(strategy):
            raise
        raise TrainingError(f"lost contact with another worker ({type(err).__name__}); every worker stops: "
                            f"restart them all to resume from the last checkpoint") from None
    if not trainer.stopped_by:
        final = final or trainer.evaluate(valid, data.baseline_id)
    monitor.close()
    step = int(trainer.step.numpy())
    manifest["segments"][-1].update({"ended_at": now(), "to_step": step})
    if trainer.stopped_by:
        manifest["segments"][-1]["stopped_by"] = trainer.stopped_by
        writes.write_manifest(manifest)
        say(f"{trainer.stopped_by}: stopped at step {step}/{train_cfg.steps} and saved a checkpoint; "
            f"to resume: {run.resume_command()}")
        return {"step": step, "stopped_by": trainer.stopped_by}
    final = {**final, "step": step}
    digest = weights_digest(model)
    manifest.update({"ended_at": now(), "final_eval": final, "weights_sha256": digest})
    writes.write_manifest(manifest)
    print_result(say, final, run, time.perf_counter() - started)
    (say if chief else print)(f"weights sha256 {digest}")  # every worker says it: compare them
    return final


def check_batch_split(batch_size: int, replicas: int) -> None:
    if batch_size % replicas:
        raise UserError(f"train.batch_size: {batch_size} windows cannot be split evenly across {replicas} replicas; "
                        f"use a multiple of {replicas}")


def start_manifest(run: RunDir, config: ExperimentConfig, data: Data, num_params: int,
                   strategy: tf.distribute.Strategy, resumed: bool, start_step: int) -> dict:
    """Write manifest.json for this run segment (a resumed run keeps its earlier segments)."""
    manifest = run.read_manifest() if resumed else {}
    manifest.update({
        "name": config.name,
        "seed": config.train.seed,
        "num_params": num_params,
        "vocab_size": data.tokenizer.vocab_size,
        "devices": describe_devices(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "data": {
            "source": data.corpus.source,
            "fingerprint": data.corpus.fingerprint,
            "train_documents": len(data.corpus.train),
            "valid_documents": len(data.corpus.valid),
            "characters": data.corpus.num_chars,
            "skipped_lines": dict(data.corpus.skipped),
            "train_windows": len(data.train_windows),
            "valid_windows": len(data.valid_windows),
        },
        **environment(),
    })
    manifest.setdefault("started_at", now())
    manifest.setdefault("segments", []).append({"started_at": now(), "from_step": start_step})
    run.write_manifest(manifest)
    return manifest


def print_summary(say, config: ExperimentConfig, data: Data, num_params: int, strategy: tf.distribute.Strategy,
                  run: RunDir) -> None:
    m, t = config.model, config.train
    vocab = data.tokenizer.vocab_size
    say(f"model: {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads, dff {m.dff}, {m.norm}-LN, "
        f"{m.position} positions, vocab {vocab:,}: {num_params:,} parameters, {t.precision}")
    if vocab != config.tokenizer.vocab_size:
        say(f"vocabulary: {vocab:,} tokens, not tokenizer.vocab_size={config.tokenizer.vocab_size:,}"
            + ("" if config.tokenizer.vocab_file else
               f" (the corpus has no more pieces seen {config.tokenizer.min_frequency}+ times)"))
    say(f"devices: {'; '.join(describe_devices(strategy))}; tokenized data {'from cache' if data.was_cached else 'cached'} "
        f"in {run.cache_dir}")
    accumulate = f" x {t.accumulate} accumulated" if t.accumulate > 1 else ""
    tokens = t.accumulate * t.batch_size * config.data.seq_len
    say(f"data: {len(data.train_windows):,} train / {len(data.valid_windows):,} valid windows of "
        f"{config.data.seq_len} tokens; batch {t.batch_size}{accumulate} ({tokens:,} tokens/step)")
    if t.warmup_steps > t.steps:
        say(f"warmup: train.warmup_steps={t.warmup_steps} is longer than the run: capped at train.steps={t.steps}")


def print_result(say, final: dict, run: RunDir, seconds: float) -> None:
    ratio = final["masked_accuracy"] / max(final["baseline_accuracy"], 1e-9)
    say(f"done in {format_duration(seconds)}: step {final['step']}, "
        f"valid loss {final['loss']:.4f} (perplexity {final['perplexity']:.1f})")
    say(f"held-out masked-token accuracy {final['masked_accuracy']:.2%} vs most-frequent-token baseline "
        f"{final['baseline_accuracy']:.2%} ({ratio:.1f}x), on {final['num_targets']:,} masked tokens")
    say(f"run directory: {run.root}")
    say(f"TensorBoard:   {tensorboard_command()} --logdir {run.logs_dir}")


def tensorboard_command() -> str:
    """`tensorboard` as this environment runs it: a venv's bin folder is often not on PATH."""
    beside = Path(sys.executable).parent / "tensorboard"
    return shlex.quote(str(beside)) if beside.is_file() else "tensorboard"


def evaluate(run_dir: Path, split: str = "valid", which: str = "latest") -> dict:
    """Score a run's latest (or best) checkpoint on cloze-masked windows of a split.

    The windows come from the run's token cache, so the corpus need not be where it was
    during training; only a run whose cache was deleted reads its corpus again.
    """
    run = RunDir(run_dir)
    config = run.load_config()
    path = find_checkpoint(run.checkpoints_dir, which)
    tokenizer = Tokenizer.load(run.tokenizer_dir)
    streams = cached_streams(run, tokenizer)
    if streams is None:
        data = prepare_data(config, run, say=lambda text: None)
        windows, baseline_id = (data.valid_windows if split == "valid" else data.train_windows), data.baseline_id
    else:
        windows, baseline_id = pack(streams[split], config.data.seq_len), most_frequent_token(streams["train"])
    with make_strategy("one_device").scope():
        model = build_model(config, tokenizer.vocab_size)
    step = restore_model(model, path)
    batches = eval_batches(windows, config.train.batch_size, EVAL_SEED, config.data.mask_rate, tokenizer.vocab_size)
    return {**Evaluator(model)(batches, baseline_id), "step": step, "split": split, "checkpoint": path}


def cached_streams(run: RunDir, tokenizer: Tokenizer) -> dict[str, np.ndarray] | None:
    """The run's tokenized train and valid streams from its cache (None unless both are there)."""
    fingerprint = run.read_manifest().get("data", {}).get("fingerprint")
    files = {split: cache_file(run.cache_dir, tokenizer, fingerprint, split) for split in ("train", "valid")}
    if not fingerprint or not all(path.is_file() for path in files.values()):
        return None
    return {split: np.load(path) for split, path in files.items()}
