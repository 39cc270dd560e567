"""Loss pieces more than one task computes."""

from __future__ import annotations

import tensorflow as tf


def smoothed_cross_entropy(logits: tf.Tensor, labels: tf.Tensor, smoothing: float) -> tf.Tensor:
    """The cross-entropy of each position against a target of (1 - smoothing) on its label plus
    smoothing spread evenly over every class (label smoothing: Szegedy et al. 2016, as in
    "Attention Is All You Need"). logits: (..., classes) float32; labels: (...) int32 -> (...)."""
    log_probs = tf.nn.log_softmax(logits)  # (..., classes)
    nll = -tf.gather(log_probs, labels, batch_dims=labels.shape.rank)  # (...)
    return (1.0 - smoothing) * nll - smoothing * tf.reduce_mean(log_probs, axis=-1) if smoothing else nll
