"""The device's measured matmul peak: the denominator of MFU.

Measured in the bench process itself (same threads, same device, same moment), because a
datasheet figure says nothing about a shared 2-core VM.
"""

from __future__ import annotations

import time

import tensorflow as tf

DTYPES = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}


def matmul_gflops(dtype: str = "fp32", size: int | None = None, reps: int = 10) -> float | None:
    """Best GFLOP/s of a square (size x size) matmul in `dtype`, or None where the device
    cannot run it. size defaults to 2048 on CPU (bigger saturates no better) and 8192 on GPU."""
    if size is None:
        size = 8192 if tf.config.list_physical_devices("GPU") else 2048
    # One element comes back to the host: waits for the whole product without timing a copy.
    matmul = tf.function(lambda a, b: tf.linalg.matmul(a, b)[0, 0])
    try:
        a = tf.cast(tf.random.stateless_normal((size, size), seed=(1, 2)), DTYPES[dtype])
        b = tf.cast(tf.random.stateless_normal((size, size), seed=(3, 4)), DTYPES[dtype])
        matmul(a, b).numpy()  # trace and create the kernel once, untimed
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.UnimplementedError):
        return None
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best / 1e9
