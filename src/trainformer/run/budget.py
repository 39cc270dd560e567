"""`train.minutes`: a wall-clock budget for a run, turned into train.steps once, as it starts.

The learning-rate schedule is laid out over train.steps from the first step (the warmup, the
triangle's peak at 75%, the decay to 0), so a budget cannot be checked as the run goes. A new
run times its own step on this machine instead: a throwaway copy of the model and optimizer
steps through the run's first PROBE_STEPS batches twice, untimed then timed, and train.steps
becomes what fits in the budget. Twice, because a classifier's length-bucketed batches come in
a dozen widths and the step function is traced once per width, a second or more each: timed
on first sight, a 20-step sample counts those traces as the step's cost and sets a fraction of
the steps that fit (zh-sentiment: docs/measured.md). The run then
trains exactly as one given that train.steps would, bit for bit (session re-seeds after the
probe), its config.yaml says how many, and a resumed run keeps the count it set.
"""

from __future__ import annotations

import dataclasses
import time

import tensorflow as tf

from trainformer.config import ExperimentConfig
from trainformer.run_dir import RunDir

PROBE_STEPS = 20


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
    """The run's first PROBE_STEPS steps' batches, over and over: what seconds_per_step reads."""
    return global_batches.take(PROBE_STEPS * accumulate).repeat()


def seconds_per_step(trainer, batches) -> float:
    """The mean wall time of a training step of trainer on PROBE_STEPS batches that it has
    stepped through once already (batches: an iterator over probe_batches), so every width is
    traced before the clock starts; each step is waited for (the loss comes back to the host,
    as in the loop's per-step finiteness check)."""
    for _ in range(PROBE_STEPS):
        trainer.train_step(batches)["loss_sum"].numpy()
    started = time.perf_counter()
    for _ in range(PROBE_STEPS):
        trainer.train_step(batches)["loss_sum"].numpy()
    return (time.perf_counter() - started) / PROBE_STEPS


def steps_in(minutes: float, seconds: float) -> int:
    """The steps of `seconds` each that fit in `minutes` (at least one)."""
    return max(1, int(minutes * 60 / seconds))
