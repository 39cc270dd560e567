"""train.minutes' probe (run/budget.py): the clock runs only over steps whose batch widths the
step function has met, so a length-bucketed classifier's traces are not counted as its step."""

import time

import tensorflow as tf

from trainformer.run.budget import probe_batches, seconds_per_step

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


def test_the_probe_times_steps_on_widths_it_has_traced():
    # every batch a width of its own, as the first batches of a length-bucketed epoch nearly are
    batches = tf.data.Dataset.range(1, 1000).map(lambda width: tf.zeros(tf.stack([2, width])))
    seconds = seconds_per_step(TracingTrainer(), iter(probe_batches(batches, accumulate=1)))
    assert seconds < TRACE_S / 4  # timed on first sight, every step would take TRACE_S
