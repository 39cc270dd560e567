"""The progress line's ETA and the one-time "expect" line, on a fake clock: the first step (set-up
and tracing) is left out of the pace, evaluations count once timed."""

import io

from trainformer.train import monitor as monitor_module
from trainformer.train.monitor import Monitor

METRICS = {"loss": 5.0, "masked_accuracy": 0.1, "learning_rate": 1e-3, "grad_norm": 1.0}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def train_steps(monitor: Monitor, clock: Clock, count: int, seconds: float) -> None:
    for _ in range(count):
        clock.now += seconds
        monitor.step_done()


def test_eta_leaves_out_the_first_step_and_adds_evaluations(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(monitor_module.time, "perf_counter", clock)
    out = io.StringIO()
    monitor = Monitor(tmp_path / "metrics.jsonl", tmp_path / "logs", total_steps=100, items_per_step=1, out=out,
                      pace_note="bf16 because this CPU has AVX512-BF16")
    train_steps(monitor, clock, 1, 10.0)  # builds the pipeline and traces the step
    train_steps(monitor, clock, 9, 1.0)
    monitor.log_train(10, dict(METRICS))
    with monitor.not_training():  # an evaluation
        clock.now += 5.0
    train_steps(monitor, clock, 10, 1.0)
    monitor.log_train(20, dict(METRICS))
    monitor.close()

    progress, expect, later = out.getvalue().splitlines()
    assert progress.endswith("ETA 1m30s")  # 90 steps at 1 s, not at the first interval's 1.9 s
    assert expect == ("  expect ~1m30s more on this machine at 1 s/step (bf16 because this CPU has AVX512-BF16), "
                      "measured after a first step of 10.0 s (set-up, tracing); evaluations and checkpoints come "
                      "on top (the ETA adds them once timed)")
    assert later.endswith("ETA 1m40s")  # 80 steps x (1 s + 5 s of evaluation / 20 steps)
