"""AdamW with linear warmup and linear decay, and the gradient transforms the step applies."""

from __future__ import annotations

import keras
import tensorflow as tf

# Weight decay regularises matrices; decaying LayerNorm scales and biases only hurts.
NO_DECAY = ["bias", "gamma", "beta"]


@keras.saving.register_keras_serializable(package="trainformer")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """0 -> peak over `warmup_steps`, then linearly down to 0 at `total_steps` (BERT's schedule)."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int):
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = (step + 1) / self.warmup_steps if self.warmup_steps else 1.0
        decay = (self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1)
        return self.peak * tf.clip_by_value(tf.minimum(warmup, decay), 0.0, 1.0)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


@keras.saving.register_keras_serializable(package="trainformer")
class Triangle(keras.optimizers.schedules.LearningRateSchedule):
    """Cramming's one-cycle ("triangle2", Geiping & Goldstein 2022): `peak` / 4 at step 0, up
    linearly to `peak` at 75% of `total_steps`, then linearly down to 0 at `total_steps`. A short
    budget spends most of its steps near the peak rate instead of decaying from the start."""

    START = 0.25  # of the peak, at step 0
    COOLDOWN = 0.25  # of the steps, from the peak down to 0

    def __init__(self, peak: float, total_steps: int):
        self.peak = peak
        self.total_steps = total_steps

    def __call__(self, step):
        progress = tf.cast(step, tf.float32) / self.total_steps  # 0 -> 1
        rise = self.START + (1.0 - self.START) * progress / (1.0 - self.COOLDOWN)
        fall = (1.0 - progress) / self.COOLDOWN
        return self.peak * tf.clip_by_value(tf.minimum(rise, fall), 0.0, 1.0)

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total_steps}


class AdamW(keras.optimizers.AdamW):
    """Keras AdamW that applies the gradients it is given, optionally with a learning rate of
    its own for each variable.

    Keras sums gradients across replicas inside `apply_gradients`, after any clipping done
    before it, so each replica would clip only its own share. The Trainer all-reduces, then
    normalises and clips the global gradient itself (loop.py); a second sum here would
    multiply it by the number of replicas.

    `lr_multipliers` ({variable path: factor}, every trainable variable named) scales each
    variable's learning rate: layer-wise learning-rate decay. Scaling the gradient instead
    would do nothing under Adam (m / sqrt(v) is invariant to it), so the factor goes where the
    rate does: into Adam's step and into the decoupled weight decay (lr * wd * w). The moments
    do not depend on the rate, so the optimizer's slots, and its checkpoints, are the same with
    or without multipliers. Without them the update is Keras's own, op for op (bitwise resume
    and determinism digests stay as they were).
    """

    def __init__(self, *args, lr_multipliers: dict[str, float] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lr_multipliers = dict(lr_multipliers or {})
        self._scales = None  # per variable index (the order build saw), when lr_multipliers is set

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return grads_and_vars

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        if self.lr_multipliers:
            unnamed = [v.path for v in variables if v.path not in self.lr_multipliers]
            if unnamed:  # a silent 1.0 would train a layer the caller meant to slow down at full rate
                raise ValueError(f"lr_multipliers: no factor for {', '.join(unnamed[:3])}")
            self._scales = [float(self.lr_multipliers[v.path]) for v in variables]

    def _apply_weight_decay(self, variables):
        if self._scales is None:
            super()._apply_weight_decay(variables)
        # else update_step decays each variable with its own rate

    def update_step(self, gradient, variable, learning_rate):
        """Keras's Adam step with this variable's rate, after its decoupled weight decay (the
        order Keras applies them in; each touches only this variable). `variable` may be one
        replica's copy: _get_variable_index finds the mirrored variable it belongs to."""
        if self._scales is None:
            return super().update_step(gradient, variable, learning_rate)
        rate = tf.cast(learning_rate, variable.dtype) * self._scales[self._get_variable_index(variable)]
        if self.weight_decay and self._use_weight_decay(variable):
            self.assign_sub(variable, variable * tf.cast(self.weight_decay, variable.dtype) * rate)
        return super().update_step(gradient, variable, rate)

    def get_config(self):
        return {**super().get_config(), "lr_multipliers": self.lr_multipliers}


def make_optimizer(peak: float, warmup_steps: int, total_steps: int, weight_decay: float,
                   lr_multipliers: dict[str, float] | None = None, schedule: str = "linear", ema: float = 0.0) -> AdamW:
    """AdamW on the warmup-then-linear-decay schedule (or Cramming's triangle, which has no
    warmup: TrainConfig.schedule); lr_multipliers: see AdamW; ema > 0: the optimizer keeps a
    moving average of the weights with that decay (Keras's own, in its variables: checkpointed
    with it; its first step copies the weights, so the start is not biased toward zero)."""
    rate = Triangle(peak, total_steps) if schedule == "triangle" else WarmupLinearDecay(peak, warmup_steps, total_steps)
    optimizer = AdamW(
        learning_rate=rate,
        weight_decay=weight_decay, beta_1=0.9, beta_2=0.98, epsilon=1e-6, lr_multipliers=lr_multipliers,
        use_ema=ema > 0, ema_momentum=ema or 0.99,
    )
    optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    return optimizer


def dense_gradients(gradients: list) -> list:
    """Turn IndexedSlices (embedding lookups) into dense gradients.

    An embedding gradient lists one row per occurrence, so a repeated id appears several
    times; Adam on such slices updates its second moment per occurrence, not per id, and
    diverges from the dense math (DESIGN.md). Summing per id (what the conversion does) gives
    exactly the dense gradient.
    """
    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]


def normalized_and_clipped(gradient_sums: list, divisor: tf.Tensor, clip_norm: float) -> tuple[list, tf.Tensor, tf.Tensor]:
    """Summed gradients -> (gradients / divisor clipped to global norm clip_norm, their global
    norm before clipping, a (variables,) float flag per variable: 1.0 where its gradient is not
    finite).

    What `tf.clip_by_global_norm([g / divisor ...])` plus an is-finite check per variable
    compute, in one pass over the gradients instead of four: the division and the clip factor
    are one scalar, and the flags come from the per-variable sums of squares the norm needs
    anyway (a sum of squares is finite exactly when every element is, short of an overflow past
    ~1e19, which is as fatal). TF's element-wise kernels are not built for AVX2/AVX-512, so
    each full pass over the gradients costs about what a matmul of the model does (issue 21).
    """
    # L2Loss (sum(g^2) / 2) is one fused kernel; square-then-sum is two passes and a temporary
    squares = 2.0 * tf.stack([tf.nn.l2_loss(tf.cast(g, tf.float32)) for g in gradient_sums])  # (variables,)
    norm = tf.sqrt(tf.reduce_sum(squares)) / divisor
    factor = tf.minimum(1.0, clip_norm / norm) / divisor  # a zero norm gives inf -> 1
    nonfinite = tf.cast(~tf.math.is_finite(squares), tf.float32)
    return [g * tf.cast(factor, g.dtype) for g in gradient_sums], norm, nonfinite


class DynamicLossScale(tf.Module):
    """fp16 loss scaling: multiply the loss so small gradients survive float16, divide the
    gradients back in float32, and adapt the factor: halve it (and skip the update) when a
    gradient overflows, double it after `growth_interval` good steps in a row.

    Its variables belong in the checkpoint: a resumed run continues with the same scale.
    """

    def __init__(self, initial: float = 2.0**15, growth_interval: int = 2000):
        super().__init__(name="loss_scale")
        self.growth_interval = growth_interval
        self.scale = tf.Variable(initial, dtype=tf.float32, trainable=False, name="scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
        self.skipped_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")

    def update(self, finite: tf.Tensor) -> None:
        """Adapt the scale after a step whose gradients were (not) all finite."""
        grow = tf.logical_and(finite, self.good_steps + 1 >= self.growth_interval)
        shrunk = tf.maximum(self.scale / 2.0, 1.0)
        self.scale.assign(tf.where(grow, self.scale * 2.0, tf.where(finite, self.scale, shrunk)))
        self.good_steps.assign(tf.where(tf.logical_and(finite, tf.logical_not(grow)), self.good_steps + 1, 0))
        self.skipped_steps.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
