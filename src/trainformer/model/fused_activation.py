"""A feed-forward activation whose forward and backward are each one XLA kernel, for training on
the TF backend (layers.feed_forward_activation picks it).

TF runs every element-wise op of an activation as its own kernel over the whole (batch, seq, dff)
tensor, and autodiff adds as many for the backward: tanh-GELU is eight kernels forward and eight
backward (TF profiler), and on CPUs TF's bf16 element-wise kernels are slower than its fp32
ones. Here the forward is one XLA-compiled function and the backward another (the upstream
gradient times the activation's derivative, written out in layers.py), both computing in
float32 from the tensor's dtype and casting back. Forward and backward of tanh-GELU on a
(2,048, 1,024) activation, zh-bert-small's at batch 32: 2.1 ms against 13.5 with TF's ops in
bf16, 1.2 against 6.7 in fp32 (2-core Xeon with AMX; benchmarks/activation_step.py);
zh-bert-small's whole bf16 step 1.21-1.23x faster. The function is the same; only rounding
differs (float32 inside instead of the compute dtype).

A gated feed-forward (model.glu) fuses the gate's product too (`fused_gated`): activation(gate) x
value forward, and both gradients backward, one kernel each.

Inference keeps the plain ops: a SavedModel, TFLite or ONNX runtime need not run XLA.
"""

from __future__ import annotations

import functools

import tensorflow as tf


@functools.cache
def fused(forward, derivative):
    """forward(x) as one XLA kernel, with a gradient that is one more: upstream * derivative(x).

    forward and derivative take and return float32 tensors; the returned function takes and
    returns any float dtype (its input's). Cached per pair, so every block shares one compiled
    kernel per shape.
    """

    @tf.function(jit_compile=True, autograph=False)
    def apply(x):
        return tf.cast(forward(tf.cast(x, tf.float32)), x.dtype)

    @tf.function(jit_compile=True, autograph=False)
    def backward(x, upstream):
        return tf.cast(tf.cast(upstream, tf.float32) * derivative(tf.cast(x, tf.float32)), x.dtype)

    @tf.custom_gradient
    def activation(x):
        return apply(x), lambda upstream: backward(x, upstream)

    return activation


@functools.cache
def fused_gated(forward, derivative):
    """forward(gate) * value as one XLA kernel, with both gradients as one more: upstream * value
    * derivative(gate) for the gate, upstream * forward(gate) for the value. Dtypes as `fused`."""

    @tf.function(jit_compile=True, autograph=False)
    def apply(gate, value):
        return tf.cast(forward(tf.cast(gate, tf.float32)) * tf.cast(value, tf.float32), gate.dtype)

    @tf.function(jit_compile=True, autograph=False)
    def backward(gate, value, upstream):
        gate32, upstream = tf.cast(gate, tf.float32), tf.cast(upstream, tf.float32)
        return (tf.cast(upstream * tf.cast(value, tf.float32) * derivative(gate32), gate.dtype),
                tf.cast(upstream * forward(gate32), value.dtype))

    @tf.custom_gradient
    def gated(gate, value):
        return apply(gate, value), lambda upstream: backward(gate, value, upstream)

    return gated
