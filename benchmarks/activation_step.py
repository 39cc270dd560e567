"""Forward + backward of a feed-forward activation: TF's ops (what inference runs) against the
XLA-fused version training runs (trainformer/model/fused_activation.py).

    python activation_step.py            # project venv; ~30 s; (2,048, 1,024) = zh-bert-small's at batch 32
    python activation_step.py --shape 4096 1536 --steps 20

Each line: median milliseconds per forward + backward of one activation tensor, inside a
tf.function, minus the same harness with the identity (the casts, the loss, the gradient's
read-back).
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from trainformer.model.layers import ACTIVATIONS, feed_forward_activation

p = argparse.ArgumentParser()
p.add_argument("--shape", type=int, nargs=2, default=(2048, 1024), help="tokens dff")
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()


def median_ms(function, dtype) -> float:
    """Median time of forward + backward of function on a random (tokens, dff) tensor of dtype."""
    x = tf.Variable(tf.random.stateless_normal(args.shape, seed=(0, 1)))
    upstream = tf.random.stateless_normal(args.shape, seed=(0, 2))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(function(tf.cast(x, dtype)), tf.float32) * upstream)
        return tape.gradient(loss, x)

    step().numpy()  # trace, compile
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step().numpy()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


print(f"forward + backward of one ({args.shape[0]:,}, {args.shape[1]:,}) activation, median of {args.steps}, ms")
for dtype in (tf.bfloat16, tf.float32):
    harness = median_ms(tf.identity, dtype)
    for name in ACTIVATIONS:
        plain = median_ms(feed_forward_activation(name, training=False), dtype) - harness
        fused = median_ms(feed_forward_activation(name, training=True), dtype) - harness
        print(f"{dtype.name:9s} {name:10s} TF ops {plain:6.2f}   fused {fused:6.2f}   {plain / fused:4.1f}x")
