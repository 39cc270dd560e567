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
    timer = matmul_timer(dtype, size)
    return None if timer is None else 2.0 * size**3 / min(timer() for _ in range(reps)) / 1e9


def relative_speed(dtype: str, baseline: str, size: int, rounds: int) -> float:
    """dtype's matmul throughput over baseline's (0 where dtype cannot run), the best of
    `rounds` timings each, taken in alternation: on a shared VM a burst of contention then
    slows both, where timing one after the other let it slow one (measured: 0.65x to 1.07x
    for the same bf16/fp32 pair in successive processes)."""
    timers = matmul_timer(dtype, size), matmul_timer(baseline, size)
    if timers[0] is None:
        return 0.0
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, timer in enumerate(timers):
            best[i] = min(best[i], timer())
    return best[1] / best[0]


def matmul_timer(dtype: str, size: int):
    """A function that times one (size x size) matmul in `dtype`, in seconds; None where the
    device cannot run it. The product is traced and run once here, untimed."""
    # One element comes back to the host: waits for the whole product without timing a copy.
    matmul = tf.function(lambda a, b: tf.linalg.matmul(a, b)[0, 0], autograph=False)
    try:
        a = tf.cast(tf.random.stateless_normal((size, size), seed=(1, 2)), DTYPES[dtype])
        b = tf.cast(tf.random.stateless_normal((size, size), seed=(3, 4)), DTYPES[dtype])
        matmul(a, b).numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.UnimplementedError):
        return None

    def seconds() -> float:
        started = time.perf_counter()
        matmul(a, b).numpy()
        return time.perf_counter() - started

    return seconds
