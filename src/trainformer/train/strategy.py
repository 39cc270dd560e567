"""Choose the tf.distribute strategy and describe the devices it runs on."""

from __future__ import annotations

import os

import tensorflow as tf


def make_strategy() -> tf.distribute.Strategy:
    """One device: the first GPU if there is one, else the CPU.

    The loop already runs through `strategy.run`, but gradient clipping and aggregation across
    replicas are not yet validated for MirroredStrategy, so more GPUs are not used silently
    with a subtly different update. GPU memory growth is switched on first so TF does not
    reserve all memory of the GPU.
    """
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # devices already initialised (e.g. a second run in one process)
            pass
    return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")


def describe_devices() -> list[str]:
    """One line per device, e.g. 'GPU:0 NVIDIA H200' or 'CPU (2 cores)'."""
    gpus = tf.config.list_physical_devices("GPU")
    lines = []
    for index, gpu in enumerate(gpus):
        details = tf.config.experimental.get_device_details(gpu)
        lines.append(f"GPU:{index} {details.get('device_name', 'GPU')}" + (" (used)" if index == 0 else " (idle)"))
    return lines or [f"CPU ({os.cpu_count()} cores)"]
