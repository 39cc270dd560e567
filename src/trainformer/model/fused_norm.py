"""LayerNorm whose forward and backward are each one XLA kernel, for training on the TF backend
(layers.LayerNorm picks it).

Keras' LayerNormalization is a dozen TF kernels forward (casts, moments, rsqrt, scale and shift,
each a pass over the (batch, seq, d) tensor) and autodiff adds more backward; zh-bert-small's
nine LayerNorms took ~14% of its step's op time (benchmarks/profile_step.py). Here the forward
is one XLA-compiled function and the backward another, with the gradient written out (Ba et
al. 2016): with x̂ = (x - mean) / std and g = upstream * gamma,

    dx = (g - mean(g) - x̂ * mean(g * x̂)) / std,   dgamma = sum(upstream * x̂),   dbeta = sum(upstream),

the means over the normalized axis (the last), the sums over every other. Both compute in
float32, as Keras does, and return x's dtype. The function is Keras' own; only rounding differs.
Inference keeps Keras' ops: a SavedModel, TFLite or ONNX runtime need not run XLA.
"""

from __future__ import annotations

import tensorflow as tf


def _normalized(x: tf.Tensor, epsilon: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """x (..., d) float32 -> x̂ (..., d) and 1 / std (..., 1) over the last axis."""
    centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    inverse_std = tf.math.rsqrt(tf.reduce_mean(tf.square(centred), axis=-1, keepdims=True) + epsilon)
    return centred * inverse_std, inverse_std


@tf.function(jit_compile=True, autograph=False)
def _forward(x, gamma, beta, epsilon):
    normalized, _ = _normalized(tf.cast(x, tf.float32), epsilon)
    return tf.cast(normalized * gamma + beta, x.dtype)


@tf.function(jit_compile=True, autograph=False)
def _backward(x, gamma, upstream, epsilon):
    width = tf.shape(x)[-1]
    rows = tf.reshape(tf.cast(x, tf.float32), (-1, width))  # (tokens, d)
    upstream_rows = tf.reshape(tf.cast(upstream, tf.float32), (-1, width))
    normalized, inverse_std = _normalized(rows, epsilon)
    scaled = upstream_rows * gamma
    dx = inverse_std * (scaled - tf.reduce_mean(scaled, axis=-1, keepdims=True)
                        - normalized * tf.reduce_mean(scaled * normalized, axis=-1, keepdims=True))
    return (tf.cast(tf.reshape(dx, tf.shape(x)), x.dtype), tf.reduce_sum(upstream_rows * normalized, axis=0),
            tf.reduce_sum(upstream_rows, axis=0))


def fused_layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """LayerNorm of x (..., d) over its last axis with float32 gamma and beta (d,): x's dtype."""
    epsilon = tf.constant(epsilon, tf.float32)

    @tf.custom_gradient
    def layer_norm(x, gamma, beta):
        return _forward(x, gamma, beta, epsilon), lambda upstream: _backward(x, gamma, upstream, epsilon)

    return layer_norm(x, gamma, beta)
