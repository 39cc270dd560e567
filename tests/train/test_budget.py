"""train.minutes' probe (run/budget.py): the clock runs only over steps whose batch widths the
step function has met, so a length-bucketed classifier's traces are not counted as its step,
and over batches sized as the run's are, not as its first few."""

import time

import numpy as np
import tensorflow as tf

from trainformer.run.budget import PROBE_STEPS, PROBE_TIMINGS, probe_batches, seconds_per_step, step_timings

TRACE_S = 0.1  # what a step costs on a width it has not met yet: a tf.function's retrace


class TracingTrainer:
    """What the probe uses of a Trainer: a step that takes TRACE_S on a batch width it meets for
    the first time and no time after."""

    def __init__(self):
        self.traced = set()

    def train_step(self, batches) -> dict:
        width = int(next(batches).shape[1])
        if width not in self.traced:
            time.sleep(TRACE_S)
            self.traced.add(width)
        return {"loss_sum": tf.constant(0.0)}


class OneSlowWindowTrainer:
    """A step that takes no time, but TRACE_S throughout the second timed window (steps
    2 x PROBE_STEPS to 3 x PROBE_STEPS: the first pass is untimed), as when the machine is busy
    for a few seconds."""

    def __init__(self):
        self.steps = 0

    def train_step(self, batches) -> dict:
        next(batches)
        if 2 * PROBE_STEPS <= self.steps < 3 * PROBE_STEPS:
            time.sleep(TRACE_S)
        self.steps += 1
        return {"loss_sum": tf.constant(0.0)}


def batches_of_widths(widths: list[int]) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(widths).map(lambda width: tf.zeros(tf.stack([2, width])))


def test_the_probe_times_steps_on_widths_it_has_traced():
    # every batch a width of its own, as the first batches of a length-bucketed epoch nearly are
    batches = batches_of_widths(list(range(1, 1000)))
    timings = step_timings(TracingTrainer(), iter(probe_batches(batches, accumulate=1)))
    assert len(timings) == PROBE_TIMINGS
    assert max(timings) < TRACE_S / 4  # timed on first sight, every step would take TRACE_S


def test_the_probe_batches_are_sized_as_the_runs_not_as_its_first_few():
    widths = [200] * PROBE_STEPS + list(range(1, 181))  # the widest first, as an unlucky epoch may begin
    chosen = [int(batch.shape[1]) for batch in probe_batches(batches_of_widths(widths), 1).take(2 * PROBE_STEPS)]
    assert chosen[:PROBE_STEPS] == chosen[PROBE_STEPS:]  # the same batches, pass after pass
    assert abs(np.mean(chosen) - np.mean(widths)) < 2  # 101.9 against 101.5; the first 20 average 200


def test_one_slow_timing_window_does_not_set_the_step():
    batches = iter(probe_batches(batches_of_widths([8] * 100), accumulate=1))
    seconds, timings = seconds_per_step(OneSlowWindowTrainer(), batches)
    assert max(timings) >= TRACE_S  # the slow window was timed ...
    assert seconds < TRACE_S / 10  # ... and left out: a mean of the three would be TRACE_S / 3
