"""The Trainer: a custom training loop (a tf.function step under a tf.distribute strategy).

Keras `fit` cannot run under MultiWorkerMirroredStrategy on this stack and cannot resume
mid-epoch (DESIGN.md), so the loop is ours: step -> log -> eval -> checkpoint.
"""

from __future__ import annotations

import math
import time

import keras
import tensorflow as tf

from trainformer.config import TrainConfig
from trainformer.errors import TrainingError
from trainformer.train.checkpoint import Checkpoints, dropout_seed_states
from trainformer.train.monitor import Monitor
from trainformer.train.optim import DynamicLossScale, dense_gradients
from trainformer.train.preemption import StopRequest

SUM = tf.distribute.ReduceOp.SUM


def masked_lm_sums(logits: tf.Tensor, targets: dict) -> dict[str, tf.Tensor]:
    """Per-token cross-entropy and accuracy on masked positions, as sums.

    logits: (batch, P, vocab) float32; targets: masked_ids (batch, P), masked_weights (batch, P).
    """
    weights = targets["masked_weights"]
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(targets["masked_ids"], logits)  # (batch, P)
    hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), targets["masked_ids"]), tf.float32)
    return {
        "loss_sum": tf.reduce_sum(losses * weights),
        "correct": tf.reduce_sum(hits * weights),
        "count": tf.reduce_sum(weights),
    }


class NonFiniteGradients(TrainingError):
    """A step produced NaN/inf gradients (outside fp16 loss scaling): the update was skipped,
    so the weights and every checkpoint are still finite."""

    def __init__(self, step: int, variables: list[str], last_checkpoint: str | None):
        more = f" (and {len(variables) - 1} more variables)" if len(variables) > 1 else ""
        resume = f"the last checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was written yet"
        super().__init__(
            f"step {step}: non-finite gradient for {variables[0]}{more}; the update was skipped and "
            f"training stopped; {resume}. Lower train.learning_rate or train.clip_norm, or check the data"
        )
        self.step = step
        self.variables = variables


def use_xla(setting: str) -> bool:
    """`auto`: XLA on GPU/TPU; off on CPU, where it measured slower (DESIGN.md)."""
    if setting == "auto":
        return bool(tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"))
    return setting == "on"


class Evaluator:
    """Scores a model on fixed cloze-masked batches.

    Example:
        metrics = Evaluator(model)(batches, baseline_id)  # loss, perplexity, masked_accuracy, ...
    """

    def __init__(self, model: keras.Model):
        self.model = model
        self._step = tf.function(self._sums, reduce_retracing=True)

    def _sums(self, inputs: dict, targets: dict, baseline_id: tf.Tensor) -> dict:
        logits = self.model(inputs, training=False)
        sums = masked_lm_sums(logits, targets)
        baseline_hits = tf.cast(tf.equal(targets["masked_ids"], baseline_id), tf.float32)
        return {**sums, "baseline_correct": tf.reduce_sum(baseline_hits * targets["masked_weights"])}

    def __call__(self, batches: list, baseline_id: int) -> dict:
        """Loss, perplexity and masked accuracy, and the accuracy of always predicting the
        most frequent training token on the same targets."""
        totals: dict[str, float] = {}
        for inputs, targets in batches:
            sums = self._step(inputs, targets, tf.constant(baseline_id, tf.int32))
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        count = max(totals["count"], 1.0)
        loss = totals["loss_sum"] / count
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "masked_accuracy": totals["correct"] / count,
            "baseline_accuracy": totals["baseline_correct"] / count,
            "num_targets": int(totals["count"]),
        }


class Trainer:
    """Trains a masked-LM model with AdamW, global-norm clipping and dense embedding gradients,
    optionally accumulating gradients over several micro-batches per update.

    Model and optimizer must have been created under `strategy.scope()`.
    """

    def __init__(self, model: keras.Model, optimizer: keras.Optimizer, strategy: tf.distribute.Strategy,
                 config: TrainConfig):
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.config = config
        with strategy.scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            optimizer.build(model.trainable_variables)  # create slots now, so a restore fills them
            self.loss_scale = DynamicLossScale() if config.precision == "fp16" else None
        # XLA compiles the replica computations (model, loss, gradients, update); fetching
        # batches stays outside, since iterators cannot be compiled.
        jit = use_xla(config.xla)
        self._compiled_step = tf.function(self._replica_step, jit_compile=jit)
        self._compiled_gradients = tf.function(self._replica_gradients, jit_compile=jit)
        self._compiled_update = tf.function(self._replica_update, jit_compile=jit)
        self._train_step = tf.function(self._distributed_train_step)
        self.evaluate = Evaluator(model)

    def checkpoint_objects(self) -> dict:
        """Everything a checkpoint must hold for an exact resume."""
        objects = {"model": self.model, "optimizer": self.optimizer, "step": self.step,
                   "dropout_seeds": dropout_seed_states(self.model)}
        return {**objects, "loss_scale": self.loss_scale} if self.loss_scale else objects

    def _replica_gradients(self, inputs: dict, targets: dict) -> tuple[list, dict]:
        """Gradients of the *summed* masked-token loss of one micro-batch (normalised later, once
        the number of masked tokens of the whole update is known), and the loss/accuracy sums."""
        with tf.GradientTape() as tape:
            sums = masked_lm_sums(self.model(inputs, training=True), targets)
            loss = sums["loss_sum"] * self.loss_scale.scale if self.loss_scale else sums["loss_sum"]
        return dense_gradients(tape.gradient(loss, self.model.trainable_variables)), sums

    def _replica_update(self, gradient_sums: list, count: tf.Tensor) -> dict:
        """Mean over the masked tokens of the global batch (loss scale undone), clip, apply.

        An update with a non-finite gradient is skipped, so weights and checkpoints stay finite:
        under fp16 the loss scale shrinks and training goes on; otherwise fit() stops with a
        diagnostic. Returns the gradient norm and, per variable, whether its gradient was
        non-finite (float, so replicas can sum it).
        """
        context = tf.distribute.get_replica_context()
        divisor = tf.maximum(context.all_reduce(SUM, count), 1.0)
        if self.loss_scale:
            divisor *= self.loss_scale.scale
        gradients = [g / divisor for g in gradient_sums]
        nonfinite = tf.stack([tf.cast(tf.reduce_any(~tf.math.is_finite(g)), tf.float32) for g in gradients])
        finite = tf.equal(tf.reduce_sum(nonfinite), 0.0)
        gradients, grad_norm = tf.clip_by_global_norm(gradients, self.config.clip_norm)

        def apply():
            self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        if self.loss_scale:
            self.loss_scale.update(finite)
        return {"grad_norm": grad_norm, "nonfinite": nonfinite}

    def _replica_step(self, inputs: dict, targets: dict) -> dict:
        gradients, sums = self._replica_gradients(inputs, targets)
        return {**sums, **self._replica_update(gradients, sums["count"])}

    def train_step(self, iterator) -> dict:
        """One optimizer update from the next `accumulate` batches of iterator.

        Batches are fetched here, outside the compiled step, so the time spent waiting for
        input is measured: it is returned as `data_wait_s`.
        """
        started = time.perf_counter()
        batches = [next(iterator) for _ in range(self.config.accumulate)]
        data_wait = time.perf_counter() - started
        return {**self._train_step(batches), "data_wait_s": data_wait}

    def _distributed_train_step(self, batches: list) -> dict:
        if len(batches) == 1:
            results = self.strategy.run(self._compiled_step, args=batches[0])
        else:
            results = self._accumulated_step(batches)
        self.step.assign_add(1)
        reduced = {k: self.strategy.reduce(SUM, v, axis=None) for k, v in results.items()}
        reduced["grad_norm"] /= self.strategy.num_replicas_in_sync
        return reduced

    def _accumulated_step(self, batches: list) -> dict:
        gradient_sums = [tf.zeros_like(v) for v in self.model.trainable_variables]
        sums = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
        for batch in batches:
            gradients, micro_sums = self.strategy.run(self._compiled_gradients, args=batch)
            gradient_sums = [total + g for total, g in zip(gradient_sums, gradients)]
            sums = {k: sums[k] + micro_sums[k] for k in sums}
        update = self.strategy.run(self._compiled_update, args=(gradient_sums, sums["count"]))
        return {**sums, **update}

    def fit(self, iterator, eval_batches: list, baseline_id: int, monitor: Monitor,
            checkpoints: Checkpoints) -> dict | None:
        """Train from the current step to config.steps, logging, evaluating and checkpointing.

        Returns the last eval's metrics (None when there was nothing to train). On SIGTERM or
        Ctrl-C it finishes the current step, saves a checkpoint and returns; `stopped_by` then
        names the signal.
        """
        self.stopped_by = None
        with StopRequest() as stop:
            return self._fit(iterator, eval_batches, baseline_id, monitor, checkpoints, stop)

    def _fit(self, iterator, eval_batches, baseline_id, monitor, checkpoints, stop) -> dict | None:
        config = self.config
        step = int(self.step.numpy())
        totals: dict[str, tf.Tensor] = {}
        metrics = None
        while step < config.steps:
            if stop.signal_name:
                with monitor.not_training():
                    checkpoints.save(step)
                self.stopped_by = stop.signal_name
                monitor.record({"event": "stopped", "signal": stop.signal_name, "step": step})
                return None
            results = self.train_step(iterator)
            step += 1
            monitor.step_done(results.pop("data_wait_s"))
            nonfinite = results.pop("nonfinite")
            if not self.loss_scale and bool(tf.reduce_any(nonfinite > 0)):  # one small host sync per step
                monitor.record({"event": "non_finite", "step": step})
                raise NonFiniteGradients(step, self._names_where(nonfinite), checkpoints.latest.latest_checkpoint)
            for key, value in {**results, "steps": 1}.items():  # tensors: no host sync per step
                totals[key] = totals.get(key, 0) + value
            last = step == config.steps
            if step % config.log_every == 0 or last:
                monitor.log_train(step, self._interval_metrics(totals))
                totals = {}
            if step % config.eval_every == 0 or last:
                with monitor.not_training():
                    metrics = self.evaluate(eval_batches, baseline_id)
                    monitor.log_eval(step, metrics)
                    if checkpoints.save_if_best(step, metrics["loss"]):
                        monitor.say(f"  new best valid loss: saved {checkpoints.best.latest_checkpoint}")
            if step % config.checkpoint_every == 0 or last:
                with monitor.not_training():
                    checkpoints.save(step)
        return metrics

    def _names_where(self, nonfinite: tf.Tensor) -> list[str]:
        flags = nonfinite.numpy()
        return [v.path for v, flag in zip(self.model.trainable_variables, flags) if flag > 0]

    def _interval_metrics(self, totals: dict) -> dict:
        count = max(float(totals["count"]), 1.0)
        metrics = {
            "loss": float(totals["loss_sum"]) / count,
            "masked_accuracy": float(totals["correct"]) / count,
            "grad_norm": float(totals["grad_norm"]) / totals["steps"],
            "learning_rate": float(self.optimizer.learning_rate),  # the next step's
        }
        if self.loss_scale:
            metrics["loss_scale"] = float(self.loss_scale.scale)
            metrics["skipped_steps"] = int(self.loss_scale.skipped_steps)
        return metrics
