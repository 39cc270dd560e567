"""Loss pieces more than one task computes."""

from __future__ import annotations

import tensorflow as tf


@tf.function(jit_compile=True, autograph=False)
def _cross_entropy_forward(logits, labels, smoothing):
    picked = tf.gather(logits, labels[..., None], batch_dims=labels.shape.rank)[..., 0]  # (...)
    # -sum(target * log_softmax) with target (1 - e) on the label and e / classes everywhere
    losses = tf.reduce_logsumexp(logits, axis=-1) - (1.0 - smoothing) * picked - smoothing * tf.reduce_mean(logits, -1)
    hits = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
    return losses, hits


@tf.function(jit_compile=True, autograph=False)
def _cross_entropy_backward(logits, labels, smoothing, upstream):
    classes = tf.shape(logits)[-1]
    target = (1.0 - smoothing) * tf.one_hot(labels, classes) + smoothing / tf.cast(classes, tf.float32)
    return (tf.nn.softmax(logits) - target) * upstream[..., None]


def fused_cross_entropy(logits: tf.Tensor, labels: tf.Tensor, smoothing: float = 0.0) -> tuple[tf.Tensor, tf.Tensor]:
    """Each position's cross-entropy and whether its argmax is the label, with the forward one
    XLA kernel and the backward (softmax - target, times the upstream gradient) another.

    smoothing e: the target is (1 - e) on the label plus e spread evenly over every class
    (label smoothing: Szegedy et al. 2016, as in "Attention Is All You Need"); 0 for the plain
    cross-entropy.

    TF's SparseSoftmaxCrossEntropyWithLogits took 22 ms of zh-bert-small's step on 640 x 8,000
    logits (TF profiler, 2-core Xeon with AMX); fused, the step is 1.05x faster
    (docs/measured.md). Labels must lie in [0, classes): out of range, TF's op raises where
    this returns garbage. logits: (..., classes) float32; labels: (...) int32 -> two (...)
    float32 tensors (hits carry no gradient)."""
    return _fused_cross_entropy(logits, labels, tf.constant(smoothing, tf.float32))


@tf.custom_gradient
def _fused_cross_entropy(logits, labels, smoothing):  # smoothing a tensor: custom_gradient takes no keywords
    losses, hits = _cross_entropy_forward(logits, labels, smoothing)

    def gradient(upstream, _):
        return _cross_entropy_backward(logits, labels, smoothing, upstream), None, None

    return (losses, hits), gradient
