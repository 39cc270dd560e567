"""One training session: a process's part of a run, from its start (or resume) to its end.

`train` is what `trainformer train` runs once run/start.py has checked and locked the run
directory, for any task: the task (tasks/) brings the data, model, loss sums and metrics;
devices, strategy, checkpoints, resume, monitor and manifest are the same for every task.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import keras
import tensorflow as tf

from trainformer.config import ExperimentConfig, long_windows
from trainformer.data.pipeline import distribute
from trainformer.errors import TrainingError, UserError
from trainformer.run.attention import AttentionSnapshot, sentence_from_windows
from trainformer.run.budget import (
    PROBE_STEPS,
    needs_probe,
    probe_batches,
    seconds_per_step,
    steps_in,
    steps_set_at_start,
    with_steps,
)
from trainformer.run.teachers import teacher_probabilities
from trainformer.run_dir import RunDir, environment, now
from trainformer.tasks import task_for
from trainformer.train.checkpoint import Checkpoints, read_best_record, restore_pretrained, weights_digest
from trainformer.train.loop import Trainer
from trainformer.train.monitor import Monitor, format_duration
from trainformer.train.noisy_tune import perturb
from trainformer.train.optim import Triangle, make_optimizer
from trainformer.train.precision import resolved
from trainformer.train.prometheus import PrometheusExporter
from trainformer.train.strategy import (
    barrier,
    configure_devices,
    describe_devices,
    is_chief,
    is_multi_worker,
    make_strategy,
)
from trainformer.xla_flags import set_xla_flags


def build_trainer(config: ExperimentConfig, task, strategy: tf.distribute.Strategy) -> Trainer:
    """The task's model, AdamW and the Trainer of config, created under strategy (what train
    and bench run). The task must be prepared: its vocabulary and labels shape the model."""
    t = config.train
    with strategy.scope():
        model = task.build_model()
        # train.layer_decay (classify only, config.validate): the task knows its model's layers
        multipliers = task.learning_rate_multipliers(model) if t.layer_decay != 1.0 else None
        optimizer = make_optimizer(t.learning_rate, min(t.warmup_steps, t.steps), t.steps, t.weight_decay,
                                   lr_multipliers=multipliers, schedule=t.schedule, ema=t.ema)
    return Trainer(model, optimizer, strategy, t, task.loss_sums, task.accuracy_name, task.shape_generic)


def train(config: ExperimentConfig, run: RunDir, source, out=sys.stdout,
          exporter: PrometheusExporter | None = None) -> dict:
    """Train (or resume) the run in run on source (tasks.load_source) and return the final
    valid metrics ({"step", "stopped_by"} instead when SIGTERM or Ctrl-C stopped it early).

    With several workers every process runs this; only the chief writes run, which must
    be on storage all workers see (they read its vocabulary, token cache and checkpoints).
    """
    set_xla_flags()  # a library caller's too, not only the CLI's (xla_flags.py)
    configure_devices(config.runtime)
    strategy = make_strategy(config.train.strategy)  # first: the multi-worker runtime must start before any op
    chief = is_chief(strategy)
    say = (lambda text: print(text, file=out, flush=True)) if chief else (lambda text: None)  # noqa: E731
    with contextlib.ExitStack() as cleanup:
        # Non-chief workers write their checkpoints and logs to a scratch folder, deleted at exit.
        writes = run if chief else RunDir(Path(cleanup.enter_context(tempfile.TemporaryDirectory())))
        log = out if chief else cleanup.enter_context(open(os.devnull, "w"))
        return _train(config, run, source, writes, strategy, say, log, exporter)


def _train(config: ExperimentConfig, run: RunDir, source, writes: RunDir, strategy: tf.distribute.Strategy,
           say, out, exporter: PrometheusExporter | None) -> dict:
    """train, in the order a run needs: config, data, model and checkpoint, the summary, the loop."""
    chief = writes == run
    given = steps_set_at_start(config, run)  # before prepare rewrites config.yaml
    if chief:
        run.prepare(given)  # as given: a run with precision auto resolves it again where it resumes
    config, precision_reason = resolved(given)
    set_up_process(config, strategy)
    task = prepare_task(config, run, source, strategy, chief, say)
    if needs_probe(config, run):
        config, task = steps_from_minutes(given, config, run, source, task, strategy, say)
    trainer = build_trainer(config, task, strategy)
    checkpoints, restored, trained_in = restore(config, run, writes, trainer, say)
    start_step = int(trainer.step.numpy())
    manifest = start_manifest(writes, config, task, trainer.model.count_params(), strategy, bool(restored),
                              start_step, precision_reason)
    if exporter:
        say(f"metrics: {exporter.url}")
    # Records past the restored step belong to steps that are trained again: drop them.
    monitor = Monitor(writes.metrics_file, writes.logs_dir, config.train.steps, task.items_per_step, out, exporter,
                      start_step=start_step, unit=task.unit, eval_line=task.eval_line,
                      pace_note=pace_note(config.train.precision, precision_reason))
    print_summary(say, config, task, trainer.model.count_params(), strategy, run, precision_reason)
    if restored:
        say_resumed(say, monitor, config, restored, start_step, trained_in)
    if start_step >= config.train.steps:
        say(f"nothing left to train: step {start_step} >= train.steps {config.train.steps} "
            f"(to train longer: {run.resume_command()} --set train.steps=N)")
    started = time.perf_counter()
    final = fit(trainer, task, strategy, monitor, checkpoints, chief)
    monitor.close()
    return finish(trainer, task, run, writes, manifest, final, say, time.perf_counter() - started)


def set_up_process(config: ExperimentConfig, strategy: tf.distribute.Strategy) -> None:
    """Seeds and kernels: what the process must fix before it builds anything."""
    check_batch_split(config, strategy.num_replicas_in_sync)
    keras.utils.set_random_seed(config.train.seed)  # Python, NumPy and TF seeds: model init, dropout
    if config.train.deterministic:
        # Deterministic kernels; our own jit_compile functions keep XLA (DESIGN.md).
        tf.config.experimental.enable_op_determinism()


def steps_from_minutes(given: ExperimentConfig, config: ExperimentConfig, run: RunDir, source, task,
                       strategy: tf.distribute.Strategy, say):
    """(config, task) with train.steps set to what fits in train.minutes on this machine, timed
    on a throwaway trainer (run/budget.py); config.yaml (the config as given) says so."""
    if is_multi_worker(strategy):
        raise UserError("train.minutes: each worker would time its own step and stop at its own count; "
                        "give a cluster train.steps (and train.minutes=0)")
    probe = build_trainer(config, task, strategy)
    batches = probe_batches(task.train_batches(0), config.train.accumulate)
    seconds, timings = seconds_per_step(probe, iter(distribute(strategy, batches)))
    steps = steps_in(config.train.minutes, seconds)
    run.write_config(with_steps(given, steps))
    say(f"train.minutes={config.train.minutes:g}: {seconds:.3f} s/step here (the median of {len(timings)} timings of "
        f"{PROBE_STEPS} steps on a throwaway copy, {min(timings):.3f}-{max(timings):.3f}) -> train.steps={steps:,}, "
        f"in {run.config_file}")
    config = with_steps(config, steps)
    set_up_process(config, strategy)  # the probe drew from the seeds: start where a run given these steps does
    # again, quietly: the task's data may depend on train.steps (data.long_seq_len's switch)
    again = prepare_task(config, run, source, strategy, True, lambda text: None)
    again.was_cached = task.was_cached  # the summary tells what this run found, not what the first prepare wrote
    return config, again


def prepare_task(config: ExperimentConfig, run: RunDir, source, strategy: tf.distribute.Strategy, chief: bool, say):
    """The task with its vocabulary and tokenized data: the chief writes them, then the other
    workers read them."""
    task = task_for(config)
    if chief:
        task.prepare(run, source, say)
        learn_from_teachers(config, run, task, say, write=True)
    barrier(strategy)
    if not chief:
        task.prepare(run, source, say, may_create_vocabulary=False)
        learn_from_teachers(config, run, task, say, write=False)
    return task


def learn_from_teachers(config: ExperimentConfig, run: RunDir, task, say, write: bool) -> None:
    """train.distill_from: the task trains on its teachers' probabilities instead of its labels."""
    if not config.train.distill_from:
        return
    task.learn_from(teacher_probabilities(config, run, task, say, write))
    keras.utils.set_random_seed(config.train.seed)  # building the teachers drew from the seeds: start afresh


def restore(config: ExperimentConfig, run: RunDir, writes: RunDir, trainer: Trainer, say):
    """(checkpoints this process writes, the checkpoint restored or None, the precision the run
    trained in until then). Every worker restores the chief's latest checkpoint; a new run
    may start its encoder from model.init_from."""
    objects = trainer.checkpoint_objects()
    checkpoints = Checkpoints(writes.checkpoints_dir, config.train.keep_checkpoints, **best_by(config, trainer),
                              **objects)
    shared = checkpoints if writes == run else Checkpoints(run.checkpoints_dir, 1, **objects)
    restored = shared.restore_latest(warn=say)
    trained_in = run.read_manifest().get("precision") if restored else None  # before this segment rewrites it
    if not restored and config.model.init_from:
        start_from_pretrained(config, trainer.model, say)
    return checkpoints, restored, trained_in


def start_from_pretrained(config: ExperimentConfig, model: keras.Model, say) -> None:
    """A new run's weights from model.init_from: the encoder (and an imported BERT's pooler)
    from its checkpoint; a seq2seq decoder's blocks from that encoder (model.decoder_init)."""
    say(f"encoder: from {restore_pretrained(model, RunDir(Path(config.model.init_from)).checkpoints_dir)}")
    if config.train.noisy_tune:
        perturb(model.encoder.trainable_weights, config.train.noisy_tune, config.train.seed)
        say(f"encoder: each weight tensor + uniform noise of width {config.train.noisy_tune:g} x its standard "
            f"deviation (train.noisy_tune, NoisyTune)")
    if config.task.type == "seq2seq" and config.model.decoder_init == "encoder":
        model.decoder.warm_start_from(model.encoder)
        say(f"decoder: its {model.decoder.num_layers} blocks start from the encoder's (model.decoder_init=encoder), "
            f"cross-attention from random")


def best_by(config: ExperimentConfig, trainer: Trainer) -> dict:
    """Checkpoints' criterion for best/: the task's valid accuracy under train.keep_best (higher
    is better), else the valid loss."""
    if config.train.keep_best:
        return {"best_metric": trainer.accuracy_name, "higher_is_better": True}
    return {"best_metric": "loss", "higher_is_better": False}


def say_resumed(say, monitor: Monitor, config: ExperimentConfig, restored: str, start_step: int,
                trained_in: str | None) -> None:
    precision = config.train.precision
    say(f"resuming from checkpoint {restored} (step {start_step}/{config.train.steps})")
    if trained_in and trained_in != precision:  # precision auto resumed on other hardware
        say(f"precision: this run trained in {trained_in} until step {start_step} and goes on in "
            f"{precision} here; its weights are float32 either way")
    monitor.record({"event": "resume", "step": start_step, "checkpoint": restored, "time": time.time()})


def fit(trainer: Trainer, task, strategy: tf.distribute.Strategy, monitor: Monitor, checkpoints: Checkpoints,
        chief: bool) -> dict | None:
    """Trainer.fit with the task's data and evaluation, the attention picture at each eval (chief
    only); the final valid metrics, or None when a signal stopped it."""
    evaluate = task.evaluator(trainer.model)
    attention = AttentionSnapshot(trainer.model, task.tokenizer, *sentence_from_windows(task.attention_windows()),
                                  layer=trainer.config.attention_layer)

    def batches_from(number: int):
        return iter(distribute(strategy, task.train_batches(number)))

    def on_eval(monitor: Monitor, step: int, metrics: dict) -> None:
        attention.log(monitor, step)
        task.on_eval(monitor, step, metrics)

    try:
        final = trainer.fit(batches_from, lambda: evaluate("valid"), monitor, checkpoints,
                            on_eval=on_eval if chief else None)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError) as err:
        if not is_multi_worker(strategy):
            raise
        raise TrainingError(f"lost contact with another worker ({type(err).__name__}); every worker stops: "
                            f"restart them all to resume from the last checkpoint") from None
    if trainer.stopped_by:
        return None
    if final:
        return final
    with trainer.averaged_weights():  # nothing left to train: what an eval would have read
        return evaluate("valid")


def finish(trainer: Trainer, task, run: RunDir, writes: RunDir, manifest: dict, final: dict | None, say,
           seconds: float) -> dict:
    """Close the segment in the manifest and say how it ended: stopped (and how to resume) or
    done (the final metrics and the weights' digest)."""
    step = int(trainer.step.numpy())
    manifest["segments"][-1].update({"ended_at": now(), "to_step": step})
    if trainer.stopped_by:
        manifest["segments"][-1]["stopped_by"] = trainer.stopped_by
        writes.write_manifest(manifest)
        say(f"{trainer.stopped_by}: stopped at step {step}/{trainer.config.steps} and saved a checkpoint; "
            f"to resume: {run.resume_command()}")
        return {"step": step, "stopped_by": trainer.stopped_by}
    final = {**final, "step": step}
    digest = weights_digest(trainer.model)
    manifest.update({"ended_at": now(), "final_eval": final, "weights_sha256": digest})
    best = read_best_record(writes.checkpoints_dir) if trainer.config.keep_best else None
    if best:
        manifest["best_eval"] = {key: best[key] for key in ("step", "metric", "value", "valid_loss")}
    writes.write_manifest(manifest)
    print_result(say, task, final, run, seconds, best)
    (say if writes == run else print)(f"weights sha256 {digest}")  # every worker says it: compare them
    return final


def best_line(best: dict) -> str:
    """The result line of a train.keep_best run: its best eval, which eval/predict/export use."""
    return (f"best: valid {best['metric'].replace('_', ' ')} {best['value']:.4f} at step {best['step']} "
            f"(checkpoints/best: what eval, predict and export use)")


def pace_note(precision: str, precision_reason: str) -> str:
    """Why a run computes in what it does, for the first time estimate: the precision is what
    moves a CPU's pace most (bf16 is 1.2-2x fp32 with AVX512-BF16/AMX, 2-3x slower without)."""
    if precision_reason.startswith("auto: "):
        return f"{precision} because {precision_reason.removeprefix('auto: ')}"
    return f"{precision} as {precision_reason} says"


def check_batch_split(config: ExperimentConfig, replicas: int) -> None:
    batch_size, long = config.train.batch_size, long_windows(config)
    if batch_size % replicas:
        raise UserError(f"train.batch_size: {batch_size} examples cannot be split evenly across {replicas} replicas; "
                        f"use a multiple of {replicas}")
    if long and long[1] % replicas:
        raise UserError(f"data.long_seq_len: its batches of {long[1]} windows cannot be split evenly across "
                        f"{replicas} replicas; choose a length that leaves a multiple of {replicas}")


def start_manifest(run: RunDir, config: ExperimentConfig, task, num_params: int,
                   strategy: tf.distribute.Strategy, resumed: bool, start_step: int, precision_reason: str) -> dict:
    """Write manifest.json for this run segment (a resumed run keeps its earlier segments)."""
    manifest = run.read_manifest() if resumed else {}
    manifest.update({
        "name": config.name,
        "task": config.task.type,
        "seed": config.train.seed,
        "num_params": num_params,
        "vocab_size": task.vocab_size,
        "devices": describe_devices(strategy),
        "replicas": strategy.num_replicas_in_sync,
        "precision": config.train.precision,
        "precision_reason": precision_reason,
        "data": task.manifest_data(),
        **environment(),
    })
    manifest.setdefault("started_at", now())
    manifest.setdefault("segments", []).append({"started_at": now(), "from_step": start_step})
    run.write_manifest(manifest)
    return manifest


def print_summary(say, config: ExperimentConfig, task, num_params: int, strategy: tf.distribute.Strategy,
                  run: RunDir, precision_reason: str) -> None:
    m, t = config.model, config.train
    vocab = task.vocab_size
    say(f"model: {config.task.type}, {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads, dff {m.dff}, "
        f"{m.norm}-LN, {m.position} positions{'' if m.use_bias else ', no biases'}"
        f"{', gated feed-forward' if m.glu else ''}, vocab {vocab:,}: "
        f"{num_params:,} parameters, {t.precision}")
    if vocab != config.tokenizer.vocab_size and not m.init_from and not config.tokenizer.vocab_file:
        say(f"vocabulary: {vocab:,} tokens, not tokenizer.vocab_size={config.tokenizer.vocab_size:,} "
            f"(the corpus has no more pieces seen {config.tokenizer.min_frequency}+ times)")
    if precision_reason.startswith("auto"):
        say(f"precision: {t.precision} ({precision_reason})")
    say(f"devices: {'; '.join(describe_devices(strategy))}; tokenized data {'from cache' if task.was_cached else 'cached'} "
        f"in {run.cache_dir}")
    for line in task.summary_lines():
        say(line)
    if t.schedule == "triangle":
        say(f"learning rate: {t.learning_rate * Triangle.START:.3g} rising to {t.learning_rate:.3g} at step "
            f"{round((1 - Triangle.COOLDOWN) * t.steps):,}, then down to 0 (train.schedule=triangle; "
            f"train.warmup_steps unused)")
    elif t.warmup_steps > t.steps:
        say(f"warmup: train.warmup_steps={t.warmup_steps} is longer than the run: capped at train.steps={t.steps}")
    if t.layer_decay != 1.0:
        say(f"layer decay {t.layer_decay}: learning rate x1 for the head, x{t.layer_decay:.3g} for the top block, "
            f"x{t.layer_decay ** (m.num_layers + 1):.3g} for the embeddings")
    if t.keep_best:
        say(f"best checkpoint: by valid {task.accuracy_name.replace('_', ' ')} (checkpoints/best)")


def print_result(say, task, final: dict, run: RunDir, seconds: float, best: dict | None = None) -> None:
    """The final lines: the last eval's, then the best eval's when train.keep_best kept one."""
    say(f"done in {format_duration(seconds)}: step {final['step']}, valid loss {final['loss']:.4f}")
    for line in task.result_lines(final):
        say(line)
    if best:
        say(best_line(best))
    say(f"run directory: {run.root}")
    say(f"TensorBoard:   {tensorboard_command()} --logdir {run.logs_dir}")


def tensorboard_command() -> str:
    """`tensorboard` as this environment runs it: a venv's bin folder is often not on PATH."""
    beside = Path(sys.executable).parent / "tensorboard"
    return shlex.quote(str(beside)) if beside.is_file() else "tensorboard"
