"""The Trainer: a custom training loop (a tf.function step under a tf.distribute strategy).

Keras `fit` cannot run under MultiWorkerMirroredStrategy on this stack and cannot resume
mid-epoch (DESIGN.md), so the loop is ours: step -> log -> eval -> checkpoint.

Every tf.function of trainformer (and every function an input pipeline maps) is traced with
autograph=False: its control flow is explicit (tf.cond, tf.while_loop), and AutoGraph's
rewrite of the model's and the loop's Python cost ~2 s of every process's start on a 2-core CPU
(tests/test_autograph.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import keras
import tensorflow as tf

from trainformer.config import TrainConfig
from trainformer.errors import TrainingError
from trainformer.train.checkpoint import Checkpoints, dropout_seed_states
from trainformer.train.monitor import Monitor
from trainformer.train.optim import (
    DynamicLossScale,
    dense_gradients,
    normalized_and_clipped,
)
from trainformer.train.preemption import StopRequest
from trainformer.train.strategy import count_votes, is_multi_worker

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN
MAX_ROLLBACKS = 3  # to one checkpoint in a row: then the run stops, as with train.on_nan=stop


class NonFiniteGradients(TrainingError):
    """A step produced NaN/inf gradients (outside fp16 loss scaling): the update was skipped,
    so the weights and every checkpoint are still finite."""

    def __init__(self, step: int, variables: list[str], last_checkpoint: str | None, after_rollbacks: bool = False):
        more = f" (and {len(variables) - 1} more variables)" if len(variables) > 1 else ""
        resume = f"the last checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was written yet"
        again = f" again after {MAX_ROLLBACKS} rollbacks to the same checkpoint" if after_rollbacks else ""
        super().__init__(
            f"step {step}: non-finite gradient for {variables[0]}{more}{again}; the update was skipped and "
            f"training stopped; {resume}. Lower train.learning_rate or train.clip_norm, or check the data"
        )
        self.step = step
        self.variables = variables


def use_xla(setting: str) -> bool:
    """Whether the forward and backward pass compile: `auto` on GPU/TPU, not on CPU, where
    it measured slower (docs/measured.md)."""
    if setting == "auto":
        return bool(tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"))
    return setting == "on"


class Trainer:
    """Trains a model with AdamW and global-norm clipping, optionally accumulating gradients
    over several micro-batches per update, on any tf.distribute strategy, for any task.

    The task's `loss_sums(outputs, targets)` returns the summed loss of a batch with its
    `count` (masked tokens, examples) and `correct` predictions. One update: every replica sums
    the gradients of its rows of the micro-batches; the sums are all-reduced, divided by the
    count of the whole update and clipped
    by their global norm, so N replicas compute the one-device update of the same global
    batch. An update with a non-finite gradient is skipped (weights and checkpoints stay
    finite): under fp16 the loss scale shrinks and training goes on; otherwise fit() stops or
    rolls back (train.on_nan).

    Model and optimizer must have been created under `strategy.scope()`.
    """

    def __init__(self, model: keras.Model, optimizer: keras.Optimizer, strategy: tf.distribute.Strategy,
                 config: TrainConfig, loss_sums: Callable[[tf.Tensor, dict], dict], accuracy_name: str = "accuracy",
                 shape_generic: bool = False):
        self.model = model
        self.loss_sums = loss_sums
        self.accuracy_name = accuracy_name  # the key its accuracy is logged under, e.g. masked_accuracy
        self.optimizer = optimizer
        self.strategy = strategy
        self.config = config
        with strategy.scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            # Batches skipped by rollbacks: step n trains on batches from n * accumulate + data_offset.
            self.data_offset = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_offset")
            optimizer.build(model.trainable_variables)  # create slots now, so a restore fills them
            self.loss_scale = DynamicLossScale() if config.precision == "fp16" else None  # auto never picks fp16
        # XLA compiles the model's forward and backward pass; batches are fetched outside
        # (iterators cannot be compiled) and the all-reduce stays outside too.
        jit = use_xla(config.xla)
        self._compiled_gradients = tf.function(self._replica_gradients, jit_compile=jit, autograph=False)
        # apply_gradients calls merge_call, which fails inside a nested tf.function when
        # there are several replicas: the update is compiled on one device only. It is XLA's
        # even where the step is not (train.xla auto on CPU): AdamW's element-wise work over
        # every weight becomes one kernel per variable, 1.07x zh-bert-small's step on a CPU.
        single = strategy.num_replicas_in_sync == 1
        compile_update = config.xla != "off"
        self._apply = (tf.function(self._replica_apply, jit_compile=compile_update, autograph=False) if single
                       else self._replica_apply)
        # One trace per batch width (length-bucketed batches come in a few): not reduce_retracing,
        # whose shape-generic trace would make a batch's kernels depend on which widths came
        # first in this process, and a resumed run differ from an uninterrupted one in the last bits.
        # shape_generic (batches cut by a token budget come in dozens of shapes): one trace for
        # every shape from the first batch on, so every run and resume runs the same kernels.
        self._train_step = None if shape_generic else tf.function(self._distributed_train_step, autograph=False)
        self._rollbacks: dict[str | None, int] = {}  # rollbacks in a row to one checkpoint

    def checkpoint_objects(self) -> dict:
        """Everything a checkpoint must hold for an exact resume."""
        objects = {"model": self.model, "optimizer": self.optimizer, "step": self.step,
                   "data_offset": self.data_offset, "dropout_seeds": dropout_seed_states(self.model)}
        return {**objects, "loss_scale": self.loss_scale} if self.loss_scale else objects

    def next_batch(self) -> int:
        """The number of the next batch to train on (see data_offset)."""
        return int(self.step.numpy()) * self.config.accumulate + int(self.data_offset.numpy())

    def _replica_gradients(self, inputs: dict, targets: dict) -> tuple[list, dict]:
        """Gradients of the *summed* loss of one micro-batch (normalised later, once the count
        of the whole update is known), and the loss/accuracy sums."""
        with tf.GradientTape() as tape:
            sums = self.loss_sums(self.model(inputs, training=True), targets)
            loss = sums["loss_sum"] * self.loss_scale.scale if self.loss_scale else sums["loss_sum"]
        return dense_gradients(tape.gradient(loss, self.model.trainable_variables)), sums

    def _replica_step(self, batches: list) -> tuple[list, dict]:
        """On each replica: the clipped global gradient of this update (the same on every
        replica), the gradient norm, per variable whether its gradient is non-finite (float,
        so it can be reduced), and this replica's loss/accuracy sums."""
        gradient_sums, sums = self._compiled_gradients(*batches[0])
        for inputs, targets in batches[1:]:
            gradients, more = self._compiled_gradients(inputs, targets)
            gradient_sums = [total + g for total, g in zip(gradient_sums, gradients)]
            sums = {k: sums[k] + more[k] for k in sums}
        context = tf.distribute.get_replica_context()
        gradient_sums, count = context.all_reduce(SUM, (gradient_sums, sums["count"]))
        divisor = tf.maximum(count, 1.0) * (self.loss_scale.scale if self.loss_scale else 1.0)
        gradients, grad_norm, nonfinite = normalized_and_clipped(gradient_sums, divisor, self.config.clip_norm)
        return gradients, {**sums, "grad_norm": grad_norm, "nonfinite": nonfinite}

    def _replica_apply(self, gradients: list) -> None:
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))

    def train_step(self, iterator) -> dict:
        """One optimizer update from the next `accumulate` batches of iterator.

        Batches are fetched here, outside the compiled step, so the time spent waiting for
        input is measured: it is returned as `data_wait_s`.
        """
        started = time.perf_counter()
        batches = [next(iterator) for _ in range(self.config.accumulate)]
        data_wait = time.perf_counter() - started
        if self._train_step is None:
            signature = [[iterator.element_spec] * self.config.accumulate]  # None wherever shapes vary
            self._train_step = tf.function(self._distributed_train_step, input_signature=signature, autograph=False)
        return {**self._train_step(batches), "data_wait_s": data_wait}

    def _distributed_train_step(self, batches: list) -> dict:
        gradients, results = self.strategy.run(self._replica_step, args=(batches,))
        # Computed from all-reduced gradients, so equal on every replica: the mean is any one.
        nonfinite = self.strategy.reduce(MEAN, results.pop("nonfinite"), axis=None)
        grad_norm = self.strategy.reduce(MEAN, results.pop("grad_norm"), axis=None)
        finite = tf.equal(tf.reduce_sum(nonfinite), 0.0)

        def apply():
            self.strategy.run(self._apply, args=(gradients,))
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))  # here, not per replica: merge_call fails in a cond branch
        if self.loss_scale:
            self.loss_scale.update(finite)
        self.step.assign_add(1)
        sums = {k: self.strategy.reduce(SUM, v, axis=None) for k, v in results.items()}
        return {**sums, "grad_norm": grad_norm, "nonfinite": nonfinite}

    def fit(self, batches_from, evaluate: Callable[[], dict], monitor: Monitor, checkpoints: Checkpoints,
            on_eval=None) -> dict | None:
        """Train from the current step to config.steps, logging, evaluating and checkpointing.

        batches_from(n) returns an iterator over the training batches from batch number n on
        (a rollback starts a new one); evaluate() returns held-out metrics with a "loss";
        on_eval(monitor, step, metrics) runs after each eval (e.g. to draw attention maps).
        Returns the last eval's metrics (None when there was
        nothing to train). On SIGTERM or Ctrl-C it finishes the current step, saves a
        checkpoint and returns; `stopped_by` then names the signal.
        """
        self.stopped_by = None
        with StopRequest() as stop:
            return self._fit(batches_from, evaluate, monitor, checkpoints, on_eval, stop)

    def _fit(self, batches_from, evaluate, monitor, checkpoints, on_eval, stop) -> dict | None:
        config = self.config
        step = int(self.step.numpy())
        iterator = batches_from(self.next_batch())
        totals: dict[str, tf.Tensor] = {}
        metrics = None
        while step < config.steps:
            signal_name = self._agreed_stop(stop)
            if signal_name:
                with monitor.not_training():
                    checkpoints.save(step)
                self.stopped_by = signal_name
                monitor.record({"event": "stopped", "signal": signal_name, "step": step})
                return None
            results = self.train_step(iterator)
            step += 1
            monitor.step_done(results.pop("data_wait_s"))
            nonfinite = results.pop("nonfinite")
            if not self.loss_scale and bool(tf.reduce_any(nonfinite > 0)):  # one small host sync per step
                step = self._on_nonfinite(step, self._names_where(nonfinite), monitor, checkpoints)
                iterator, totals = batches_from(self.next_batch()), {}
                continue
            for key, value in {**results, "steps": 1}.items():  # tensors: no host sync per step
                totals[key] = totals.get(key, 0) + value
            last = step == config.steps
            if step % config.log_every == 0 or last:
                monitor.log_train(step, self._interval_metrics(totals))
                totals = {}
            if step % config.eval_every == 0 or last:
                with monitor.not_training(), self.averaged_weights():
                    metrics = evaluate()
                    monitor.log_eval(step, metrics)
                    if on_eval:
                        on_eval(monitor, step, metrics)
                    if checkpoints.save_if_best(step, metrics):
                        metric = checkpoints.best_metric.replace("_", " ")
                        monitor.say(f"  new best valid {metric}: saved {checkpoints.best.latest_checkpoint}")
            if step % config.checkpoint_every == 0 or last:
                with monitor.not_training():
                    checkpoints.save(step)
        return metrics

    @contextlib.contextmanager
    def averaged_weights(self):
        """With train.ema: the model holds the moving average of its weights inside (what an
        evaluation and checkpoints/best read), its trained weights again after."""
        if not self.optimizer.use_ema:
            yield
            return
        variables = self.model.trainable_variables
        trained = [tf.identity(v) for v in variables]
        # Keras 3 keeps the averages there, in build's variable order, with no public accessor
        for variable, average in zip(variables, self.optimizer._model_variables_moving_average):
            variable.assign(average)
        try:
            yield
        finally:
            for variable, value in zip(variables, trained):
                variable.assign(value)

    def _agreed_stop(self, stop: StopRequest) -> str | None:
        """The signal that stops training before the next step. Workers agree on it (a worker
        stopping alone would leave the others waiting in the next all-reduce for ever)."""
        if not is_multi_worker(self.strategy):
            return stop.signal_name
        if count_votes(self.strategy, bool(stop.signal_name)) == 0:
            return None
        return stop.signal_name or "a signal to another worker"

    def _on_nonfinite(self, step: int, variables: list[str], monitor: Monitor, checkpoints: Checkpoints) -> int:
        """Stop (train.on_nan=stop), or roll back: restore the latest checkpoint and skip every
        batch trained on since, the offending one included (a loss spike usually builds up
        over several batches). Without a checkpoint only the offending batches are skipped:
        their update was never applied. Returns the step training goes on from."""
        last_checkpoint = checkpoints.latest.latest_checkpoint
        monitor.record({"event": "non_finite", "step": step, "variables": variables[:5]})
        rollbacks = self._rollbacks.get(last_checkpoint, 0) + 1
        if self.config.on_nan == "stop" or rollbacks > MAX_ROLLBACKS:
            raise NonFiniteGradients(step, variables, last_checkpoint, rollbacks > MAX_ROLLBACKS)
        self._rollbacks = {last_checkpoint: rollbacks}
        consumed = self.next_batch()  # batches trained on so far, the offending ones included
        with monitor.not_training():
            restored = checkpoints.restore_latest(warn=monitor.say) if last_checkpoint else None
        if not restored:
            self.step.assign(step - 1)
        back_to = int(self.step.numpy())
        self.data_offset.assign(consumed - back_to * self.config.accumulate)
        monitor.rewind(back_to)
        monitor.record({"event": "rollback", "step": step, "to_step": back_to, "checkpoint": restored,
                        "next_batch": consumed})
        monitor.say(f"step {step}: non-finite gradient for {variables[0]}; rolled back to step {back_to}"
                    f"{f' ({restored})' if restored else ''}, training goes on from batch {consumed}")
        return back_to

    def _names_where(self, nonfinite: tf.Tensor) -> list[str]:
        flags = nonfinite.numpy()
        return [v.path for v, flag in zip(self.model.trainable_variables, flags) if flag > 0]

    def _interval_metrics(self, totals: dict) -> dict:
        count = max(float(totals["count"]), 1.0)
        metrics = {
            "loss": float(totals["loss_sum"]) / count,
            self.accuracy_name: float(totals["correct"]) / count,
            "grad_norm": float(totals["grad_norm"]) / totals["steps"],
            "learning_rate": float(self.optimizer.learning_rate),  # the next step's
        }
        if "items" in totals:  # a task whose batches vary in size counts its tokens or examples itself
            metrics["items"] = float(totals["items"])
        if self.loss_scale:
            metrics["loss_scale"] = float(self.loss_scale.scale.numpy())  # .numpy(): mirrored variables too
            metrics["skipped_steps"] = int(self.loss_scale.skipped_steps.numpy())
        return metrics
