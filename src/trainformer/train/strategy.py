"""Devices and the tf.distribute strategy: which replicas train, and which process writes.

Every strategy runs the same Trainer step: the replicas all-reduce their gradient sums, so
one device, N GPUs and N workers compute the same update for the same global batch.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from trainformer.config import RuntimeConfig
from trainformer.errors import UserError

STRATEGIES = ("one_device", "mirrored", "multi_worker", "tpu")


def configure_devices(runtime: RuntimeConfig) -> None:
    """Apply runtime settings that TensorFlow only accepts before it initialises its devices:
    GPU memory growth (so TF does not reserve a whole GPU at start) and logical CPU devices."""
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, runtime.memory_growth)
        except RuntimeError:  # already initialised, e.g. a second run in one process
            pass
    if runtime.cpu_devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * runtime.cpu_devices)
        except RuntimeError:
            if len(tf.config.list_logical_devices("CPU")) != runtime.cpu_devices:
                raise UserError("runtime.cpu_devices: TensorFlow's devices were initialised before it could be "
                                "applied; set it in a fresh process") from None


def cluster_workers() -> int:
    """How many processes TF_CONFIG names (0 without TF_CONFIG)."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {})
    except json.JSONDecodeError as err:
        raise UserError(f"TF_CONFIG: not valid JSON ({err})") from None
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker"))


def resolve_strategy(name: str) -> str:
    """`auto`: multi_worker when TF_CONFIG names several processes, mirrored with several
    GPUs, otherwise one device."""
    if name != "auto":
        return name
    if cluster_workers() > 1:
        return "multi_worker"
    return "mirrored" if len(tf.config.list_physical_devices("GPU")) > 1 else "one_device"


def make_strategy(name: str = "one_device") -> tf.distribute.Strategy:
    """The strategy for train.strategy. Call it before any other TensorFlow work: the
    multi-worker strategy must configure the collective runtime first."""
    name = resolve_strategy(name)
    if name == "multi_worker":
        return _multi_worker_strategy()
    if name == "tpu":
        return _tpu_strategy()
    gpus = tf.config.list_logical_devices("GPU")  # (initialises the devices)
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    # mirrored: every GPU, else every logical CPU (runtime.cpu_devices)
    return tf.distribute.MirroredStrategy([d.name for d in gpus or tf.config.list_logical_devices("CPU")])


def _multi_worker_strategy() -> tf.distribute.Strategy:
    if cluster_workers() < 1:
        raise UserError("train.strategy: multi_worker needs TF_CONFIG naming the cluster and this task "
                        "(trainformer launch sets it for local workers; see README, 'Many devices, many machines')")
    kinds = tf.distribute.experimental.CommunicationImplementation
    implementation = kinds.NCCL if tf.config.list_physical_devices("GPU") else kinds.RING
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _tpu_strategy() -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as err:
        raise UserError(f"train.strategy: tpu: no TPU found ({str(err).splitlines()[0]})") from None
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run directory (always, except non-chief workers)."""
    return strategy.extended.should_checkpoint


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """One process per worker, each running this code (between-graph replication)."""
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def count_votes(strategy: tf.distribute.Strategy, vote: bool) -> int:
    """How many replicas of all workers voted yes (a collective: every worker must call it)."""
    votes = _count_votes(strategy, tf.constant(1.0 if vote else 0.0))
    return round(float(votes))


@tf.function(autograph=False)  # run eagerly, the multi-worker strategy warns of its overhead
def _count_votes(strategy: tf.distribute.Strategy, vote: tf.Tensor) -> tf.Tensor:
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(vote,)), axis=None)


def barrier(strategy: tf.distribute.Strategy) -> None:
    """Wait until every worker reaches this point (nothing to wait for without workers)."""
    if is_multi_worker(strategy):
        count_votes(strategy, True)


def describe_devices(strategy: tf.distribute.Strategy | None = None) -> list[str]:
    """One line per GPU ('GPU:0 NVIDIA H200') or the CPU, and how the strategy uses them."""
    gpus = tf.config.list_physical_devices("GPU")
    lines = [f"GPU:{i} {tf.config.experimental.get_device_details(gpu).get('device_name', 'GPU')}"
             for i, gpu in enumerate(gpus)] or [f"CPU ({os.cpu_count()} cores)"]
    if strategy is not None:
        devices = ", ".join(d.split("/")[-1].lower().replace("device:", "") for d in strategy.extended.worker_devices)
        workers = cluster_workers() if is_multi_worker(strategy) else 1
        lines.append(f"{type(strategy).__name__}: {strategy.num_replicas_in_sync} replica(s)"
                     + (f" on {workers} workers" if workers > 1 else "") + f" ({devices} here)")
    return lines
