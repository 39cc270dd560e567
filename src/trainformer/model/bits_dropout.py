"""Dropout masks from 16 random bits per element, for training on the TF backend
(layers.Dropout picks it).

TF's stateless_dropout (what keras.layers.Dropout runs) draws one uniform float per element in
the input's dtype: StatelessRandomUniformV2 was a fifth of the op time of zh-sentiment's bf16
step at zh-bert-small's sizes (its widest batch, R-Drop's 64 x 256 rows; 2-core AMD EPYC Zen 5,
benchmarks/profile_step.py), most of it over the (batch, heads, q, k) attention
probabilities; and in bf16 its 8-bit uniforms drop 10.16% of the elements where rate says 10%.
Here each Philox uint32 is two 16-bit draws, kept where draw >= round(rate * 65536): on
(64, 4, 256, 256) bf16 probabilities 36.5 against 81 ms, that step's op time 1,582 against
1,892 ms, `trainformer bench` 1.05-1.13x, a whole fine-tune ~1.03x (7m38s against 7m49s); the
rate exact to 2^-16 in every dtype. The draws are not TF's, so masks differ from
keras.layers.Dropout's for the same seed; a run is as reproducible as before.
"""

from __future__ import annotations

import tensorflow as tf

LEVELS = 2**16  # the values of one draw


def bits_dropout(inputs: tf.Tensor, rate: float, seed: tf.Tensor) -> tf.Tensor:
    """inputs with each element zeroed with probability round(rate * 65536) / 65536 and the rest
    divided by (1 - rate); seed: a SeedGenerator's (2,) state, as Keras' dropout takes it."""
    seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)  # stateless ops want int32 (Keras does this)
    size = tf.size(inputs)
    bits = tf.random.stateless_uniform([(size + 1) // 2], seed, minval=None, maxval=None, dtype=tf.uint32)
    draws = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]  # two draws per uint32
    keep = tf.reshape(draws, tf.shape(inputs)) >= round(rate * LEVELS)
    return tf.where(keep, inputs * tf.cast(1.0 / (1.0 - rate), inputs.dtype), tf.zeros_like(inputs))
