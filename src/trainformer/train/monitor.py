"""What a run reports: a progress line for people, metrics.jsonl for tools, TensorBoard."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import tensorflow as tf

from trainformer.files import write_atomic


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def keep_records_until(path: Path, step: int, keep_events: bool = False) -> None:
    """Cut metrics.jsonl back to a restored step: the records of later steps (written before a
    crash, or before a rollback) are written again as those steps are retrained, so each step
    appears once. With keep_events the event records stay (a rollback's own non_finite and
    rollback records say what happened at those steps). Half a line left by a crash
    mid-append goes too. Rewritten atomically."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if line.endswith("\n") and _kept(json.loads(line), step, keep_events)]
    if kept != lines:
        write_atomic(path, "".join(kept))


def _kept(record: dict, step: int, keep_events: bool) -> bool:
    return record.get("step", 0) <= step or (keep_events and "event" in record)


class Monitor:
    """Writes every logged step and eval to metrics.jsonl (one JSON object per line, appended,
    flushed per line) and TensorBoard (logs/train, logs/valid), and prints a progress line."""

    def __init__(self, metrics_file: Path, logs_dir: Path, total_steps: int, items_per_step: int, out=sys.stdout,
                 exporter=None, start_step: int = 0, unit: str = "tok", eval_line=None, pace_note: str = ""):
        self.metrics_file = metrics_file
        keep_records_until(metrics_file, start_step)
        self.logs_dir = logs_dir
        self.total_steps = total_steps
        self.items_per_step = items_per_step  # tokens (unit "tok") or examples ("ex") per step; None: counted
        self.rate_key = "tokens_per_s" if unit == "tok" else "examples_per_s"
        self.unit = unit
        self.eval_line = eval_line or (lambda metrics: f"loss {metrics['loss']:.4f}")
        self.out = out
        self.exporter = exporter  # e.g. a PrometheusExporter; gets every logged metric
        self._writers: dict[str, tf.summary.SummaryWriter] = {}
        self._interval_start = time.perf_counter()
        self._interval_steps = 0
        self._interval_excluded = 0.0  # seconds of eval/checkpointing inside the interval
        self._interval_data_wait = 0.0  # seconds the steps waited for input
        # The ETA extrapolates this process's measured pace. Its first step also builds the
        # input pipeline and traces the step (seconds): counted once, not once per step left.
        self.pace_note = pace_note  # why the pace is what it is (e.g. the precision chosen), said once
        self._first_step_s: float | None = None
        self._interval_has_first_step = False
        self._steps_done = 0  # in this process
        self._not_training_s = 0.0  # evals and checkpoints in this process: their share of the ETA
        self._expectation_said = False

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def rewind(self, step: int) -> None:
        """A rollback to `step`: its later steps are trained again, so their records go; the
        events (what went wrong, where to) stay."""
        keep_records_until(self.metrics_file, step, keep_events=True)

    def record(self, entry: dict) -> None:
        with open(self.metrics_file, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    def step_done(self, data_wait_s: float = 0.0) -> None:
        if self._first_step_s is None:
            self._first_step_s = time.perf_counter() - self._interval_start - self._interval_excluded
            self._interval_has_first_step = True
        self._steps_done += 1
        self._interval_steps += 1
        self._interval_data_wait += data_wait_s

    def log_train(self, step: int, metrics: dict) -> None:
        """Log the mean training metrics of the steps since the last call."""
        elapsed = time.perf_counter() - self._interval_start - self._interval_excluded
        steps_per_s = self._interval_steps / max(elapsed, 1e-9)
        data_wait_pct = 100.0 * self._interval_data_wait / max(elapsed, 1e-9)
        items = metrics.pop("items", None)  # counted by the task (varying batches), else items_per_step each
        rate = items / max(elapsed, 1e-9) if items is not None else steps_per_s * self.items_per_step
        metrics = {**metrics, self.rate_key: rate, "data_wait_pct": data_wait_pct}
        seconds_per_step = self._seconds_per_step(elapsed)
        self._interval_start, self._interval_steps = time.perf_counter(), 0
        self._interval_excluded = self._interval_data_wait = 0.0
        self._interval_has_first_step = False
        self._write("train", step, metrics)
        eta_s = (self.total_steps - step) * (seconds_per_step + self._not_training_s / max(self._steps_done, 1))
        eta = format_duration(eta_s)
        accuracy = next(key for key in metrics if key.endswith("accuracy"))  # e.g. masked_accuracy
        label = accuracy.replace("_accuracy", " acc").replace("accuracy", "acc")
        self.say(
            f"step {step:>{len(str(self.total_steps))}}/{self.total_steps}  loss {metrics['loss']:.4f}  "
            f"{label} {metrics[accuracy]:6.2%}  lr {metrics['learning_rate']:.2e}  "
            f"|g| {metrics['grad_norm']:.2f}  {metrics[self.rate_key]:,.0f} {self.unit}/s  "
            f"data-wait {metrics['data_wait_pct']:.1f}%  ETA {eta}"
            + (f"  scale {metrics['loss_scale']:.0f} skipped {metrics['skipped_steps']}" if "loss_scale" in metrics else "")
        )
        if not self._expectation_said and step < self.total_steps:
            self._expectation_said = True
            self.say(self._expectation(eta_s, seconds_per_step))

    def _seconds_per_step(self, elapsed: float) -> float:
        """The interval's training seconds per step, without the process's first step (set-up
        and tracing) when the interval has other steps to measure."""
        steps, seconds = self._interval_steps, elapsed
        if self._interval_has_first_step and steps > 1:
            steps, seconds = steps - 1, seconds - self._first_step_s
        return max(seconds, 1e-9) / max(steps, 1)

    def _expectation(self, eta_s: float, seconds_per_step: float) -> str:
        """What the first progress line of a process lets it promise: the time left at the
        pace measured on this machine, and why the pace is what it is."""
        text = f"  expect ~{format_duration(eta_s)} more on this machine at {seconds_per_step:.3g} s/step"
        if self.pace_note:
            text += f" ({self.pace_note})"
        if self._first_step_s is not None and self._first_step_s > 2 * seconds_per_step:
            text += f", measured after a first step of {self._first_step_s:.1f} s (set-up, tracing)"
        if not self._not_training_s:
            text += "; evaluations and checkpoints come on top (the ETA adds them once timed)"
        return text

    def log_eval(self, step: int, metrics: dict) -> None:
        self._write("valid", step, metrics)
        self.say(f"  valid @ {step}: {self.eval_line(metrics)}")

    def log_image(self, step: int, name: str, image) -> None:
        """Write one image, (1, H, W, 3 or 4) uint8, to the valid TensorBoard log at step."""
        with self.writer("valid").as_default(step=step):
            tf.summary.image(name, image, max_outputs=1)
        self.writer("valid").flush()

    @contextlib.contextmanager
    def not_training(self):
        """Keep time spent in eval and checkpointing out of tokens/s and the ETA."""
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self._interval_excluded += spent
            self._not_training_s += spent

    def _write(self, split: str, step: int, metrics: dict) -> None:
        self.record({"split": split, "step": step, "time": time.time(), **metrics})
        with self.writer(split).as_default(step=step):
            for name, value in metrics.items():
                if isinstance(value, (int, float)):  # per-class tables and matrices: metrics.jsonl only
                    tf.summary.scalar(name, value)
        self.writer(split).flush()
        if self.exporter:
            self.exporter.update(split, step, metrics)

    def writer(self, split: str) -> tf.summary.SummaryWriter:
        """The TensorBoard writer of logs/<split>, created on first use: a rerun that has
        nothing to train adds no empty event files."""
        if split not in self._writers:
            self._writers[split] = tf.summary.create_file_writer(str(self.logs_dir / split))
        return self._writers[split]

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
