"""`train.minutes`: a wall-clock budget for a run, turned into train.steps once, as it starts.

The learning-rate schedule is laid out over train.steps from the first step (the warmup, the
triangle's peak at 75%, the decay to 0), so a budget cannot be checked as the run goes. A new
run times its own step on this machine instead: a throwaway copy of the model and optimizer
steps through PROBE_STEPS of the run's batches once untimed, then PROBE_TIMINGS times timed,
and train.steps becomes what fits in the budget at the median timing. The run then trains
exactly as one given that train.steps would, bit for bit (session re-seeds after the probe),
its config.yaml says how many, and a resumed run keeps the count it set.

A classifier's length-bucketed batches are why the probe is more than a stopwatch: they come
in a dozen widths, 16 to 256 tokens, and the step function is traced once per width, a second
or more each; and 20 batches in a row are a small sample of widths. So the probe steps through
its batches once before the clock starts, and takes them from PROBE_POOL times as many, one
from each slice by size. zh-sentiment's 13 minutes were 553 steps when the traces were timed,
1,218 traced but from its first 20 batches (112 tokens wide on average, its epoch 83), and
are 1,611-1,641 now, as the loop's pace says (docs/measured.md).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import tensorflow as tf

from trainformer.config import ExperimentConfig
from trainformer.run_dir import RunDir

PROBE_STEPS = 20
PROBE_TIMINGS = 3  # the step is their median: one 20-step window can be ~28% off (docs/measured.md)
PROBE_POOL = 10  # the timed batches are every PROBE_POOL-th of PROBE_POOL x as many, by size


def with_steps(config: ExperimentConfig, steps: int) -> ExperimentConfig:
    return dataclasses.replace(config, train=dataclasses.replace(config.train, steps=steps))


def steps_set_at_start(config: ExperimentConfig, run: RunDir) -> ExperimentConfig:
    """A resumed run with train.minutes trains to the steps it set when it started (its
    config.yaml), whatever train.steps the recipe says: the schedule was laid out over those."""
    if config.train.minutes and run.has_checkpoint():
        return with_steps(config, run.load_config().train.steps)
    return config


def needs_probe(config: ExperimentConfig, run: RunDir) -> bool:
    return bool(config.train.minutes) and not run.has_checkpoint()


def probe_batches(global_batches: tf.data.Dataset, accumulate: int) -> tf.data.Dataset:
    """PROBE_STEPS steps' batches, over and over (what seconds_per_step reads), sized as the
    run's are: of its first PROBE_POOL x as many, sorted by size, the middle one of each
    PROBE_POOL in a row."""
    pool = sorted(global_batches.take(PROBE_POOL * PROBE_STEPS * accumulate), key=elements)
    chosen = pool[PROBE_POOL // 2 :: PROBE_POOL]
    return tf.data.Dataset.from_generator(lambda: iter(chosen), output_signature=global_batches.element_spec).repeat()


def elements(batch) -> int:
    """How many numbers a batch holds, its tensors' sizes summed: what a step's cost grows with."""
    return sum(int(tf.size(tensor)) for tensor in tf.nest.flatten(batch))


def seconds_per_step(trainer, batches) -> tuple[float, list[float]]:
    """(a training step's seconds, the step_timings it is the median of): one timing window the
    machine slowed or sped does not set the run's steps."""
    timings = step_timings(trainer, batches)
    return statistics.median(timings), timings


def step_timings(trainer, batches) -> list[float]:
    """PROBE_TIMINGS timings of a training step of trainer, each the mean wall time over the
    PROBE_STEPS steps' batches of probe_batches (batches: an iterator over them), each batch
    stepped through once before any clock starts, so that every width is traced; each step is
    waited for (the loss comes back to the host, as in the loop's per-step finiteness check)."""
    run_steps(trainer, batches)
    timings = []
    for _ in range(PROBE_TIMINGS):
        started = time.perf_counter()
        run_steps(trainer, batches)
        timings.append((time.perf_counter() - started) / PROBE_STEPS)
    return timings


def run_steps(trainer, batches) -> None:
    for _ in range(PROBE_STEPS):
        trainer.train_step(batches)["loss_sum"].numpy()


def steps_in(minutes: float, seconds: float) -> int:
    """The steps of `seconds` each that fit in `minutes` (at least one)."""
    return max(1, int(minutes * 60 / seconds))
