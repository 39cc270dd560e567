"""The fused cross-entropy against TF's own ops: the same values and gradients."""

import numpy as np
import pytest
import tensorflow as tf

from trainformer.tasks.losses import fused_cross_entropy


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_cross_entropy_equals_tf_cross_entropy(smoothing):
    rng = np.random.default_rng(0)
    logits = tf.Variable(rng.normal(0, 4, (2, 5, 30)).astype("float32"))  # (batch, P, vocab)
    labels = tf.constant(rng.integers(0, 30, (2, 5)).astype("int32"))
    labels = tf.tensor_scatter_nd_update(labels, [[0, 0]], [int(tf.argmax(logits[0, 0]))])  # one hit at least
    weights = tf.constant(rng.uniform(0, 1, (2, 5)).astype("float32"))  # an upstream gradient that is not all ones

    with tf.GradientTape(persistent=True) as tape:
        losses, hits = fused_cross_entropy(logits, labels, smoothing)
        target = (1 - smoothing) * tf.one_hot(labels, 30) + smoothing / 30  # (batch, P, vocab)
        expected = tf.nn.softmax_cross_entropy_with_logits(target, logits)
        fused_sum, tf_sum = tf.reduce_sum(losses * weights), tf.reduce_sum(expected * weights)

    np.testing.assert_allclose(losses.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(hits.numpy(), (tf.argmax(logits, -1, output_type=tf.int32) == labels).numpy())
    assert hits.numpy()[0, 0] == 1.0
    np.testing.assert_allclose(tape.gradient(fused_sum, logits).numpy(), tape.gradient(tf_sum, logits).numpy(),
                               rtol=1e-5, atol=1e-6)
