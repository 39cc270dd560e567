"""Rotary position embedding as one XLA kernel forward and one backward, for training on the
TF backend (layers.rotate picks it).

`rotate` in TF's ops is a dozen kernels per block forward (the angles' cos and sin, their tiles
and casts, a split, a negation, a concatenation, two products and a sum for each of query and
key) and as many backward: several percent of zh-bert-small's op time
(benchmarks/profile_step.py). The rotation is linear and orthogonal, so its gradient is the
rotation by the opposite angles: the backward is the forward with sin negated. Both compute in
float32 and return each tensor's dtype. Inference and every export keep the plain ops.
"""

from __future__ import annotations

import tensorflow as tf

from trainformer.model.layers import rotary_rates


@tf.function(jit_compile=True, autograph=False)
def _turn(tensors, rates, sign):
    """Each of tensors (batch, seq, heads, head_dim) turned by sign x its positions' angles."""
    length = tf.shape(tensors[0])[1]
    angles = tf.expand_dims(tf.cast(tf.range(length), tf.float32), 1) * rates  # (seq, head_dim / 2)
    cos, sin = (tf.reshape(tf.tile(f(angles), (1, 2)), (1, length, 1, -1)) for f in (tf.cos, tf.sin))
    turned = []
    for x in tensors:
        x32 = tf.cast(x, tf.float32)
        first, second = tf.split(x32, 2, axis=-1)
        turned.append(tf.cast(x32 * cos + tf.concat([-second, first], axis=-1) * (sign * sin), x.dtype))
    return turned


def fused_rotate(*tensors):
    """layers.rotate's result for tensors of one shape (batch, seq, heads, head_dim): a tuple."""
    rates = tf.constant(rotary_rates(tensors[0].shape[-1]))

    @tf.custom_gradient
    def rotate(*xs):
        return tuple(_turn(xs, rates, 1.0)), lambda *upstream: _turn(upstream, rates, -1.0)

    return rotate(*tensors)
