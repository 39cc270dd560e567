"""Dynamic batching, as TF Serving's `--enable_batching`: requests that arrive together are
merged into one model call of up to `max_batch` rows, waiting at most `timeout_s` after the
first for more, and each caller gets its own rows back.

One worker thread makes every model call, fed by a queue, so the server's event loop never
blocks on TensorFlow and TensorFlow's own thread pools are never fought over. While a call
runs, new requests queue up: under load batches fill without any waiting.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

Arrays = dict[str, np.ndarray]


class Overloaded(Exception):
    """The queue already holds `max_queue` rows: the caller should retry later (503)."""


class Closed(Exception):
    """The batcher is shutting down and takes no new work."""


@dataclass
class Job:
    """One request: its signature (the server passes the Signature object itself, so requests
    to two versions never merge; any key compared with == will do), inputs (rows, ...) and the
    future its outputs go to."""

    signature: object
    inputs: Arrays
    future: Future = field(default_factory=Future)

    @property
    def rows(self) -> int:
        return len(next(iter(self.inputs.values())))

    def joins(self, other: "Job") -> bool:
        """Whether the two can share a model call: same signature and same row shapes
        (ids rows of another width would need padding, and padding may change answers)."""
        return self.signature == other.signature and all(
            other.inputs[name].shape[1:] == array.shape[1:] for name, array in self.inputs.items())


_STOP = object()  # queued by close(): everything before it is still answered


class Batcher:
    """Merges concurrent `submit`s into calls of `run(signature, inputs) -> outputs`.

    Args:
        run: the model call; every input and output is batch-major.
        max_batch: most rows in one call (1 turns merging off). A request is never split,
            so one larger than this runs alone.
        timeout_s: how long the first request of a batch waits for others to join; 0: only
            those already queued join (under load, the ones that came during the last call).
        max_queue: most rows waiting; beyond it `submit` raises Overloaded.
        on_batch: called with the row count of every model call (metrics).

    Example:
        batcher = Batcher(lambda name, inputs: model.signatures[name](inputs), max_batch=64)
        outputs = batcher.submit("serving_default", {"text": np.array([b"hi"], object)}).result()
        batcher.close()
    """

    def __init__(self, run: Callable[[object, Arrays], Arrays], max_batch: int = 64, timeout_s: float = 0.0,
                 max_queue: int = 4096, on_batch: Callable[[int], None] = lambda rows: None):
        self.run = run
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.max_queue = max_queue
        self.on_batch = on_batch
        self.queue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.queued_rows = 0
        self.closed = False
        self.worker = threading.Thread(target=self._work, name="model-worker", daemon=True)
        self.worker.start()

    def submit(self, signature, inputs: Arrays) -> Future:
        """Queue one request; its future gets the outputs for its rows, or the model's exception."""
        job = Job(signature, inputs)
        with self.lock:
            if self.closed:
                raise Closed("the server is shutting down")
            if self.queued_rows and self.queued_rows + job.rows > self.max_queue:
                raise Overloaded(f"{self.queued_rows} instances are already waiting (--max-queue {self.max_queue})")
            self.queued_rows += job.rows
            self.queue.put(job)
        return job.future

    def close(self) -> None:
        """Take no more requests, answer every queued one, then stop the worker."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.queue.put(_STOP)
        self.worker.join()

    def _work(self) -> None:
        carry = None  # a job that could not join the last batch: it starts the next one
        while True:
            first = carry if carry is not None else self.queue.get()
            if first is _STOP:
                return
            batch, carry = self._collect(first)
            with self.lock:
                self.queued_rows -= sum(job.rows for job in batch)
            live = [job for job in batch if job.future.set_running_or_notify_cancel()]  # not the gone callers
            if live:
                self._answer(live)

    def _collect(self, first: Job) -> tuple[list[Job], object]:
        """`first` and the jobs that join it within the timeout; the first that does not fit."""
        batch, rows = [first], first.rows
        deadline = time.monotonic() + self.timeout_s
        while rows < self.max_batch:
            try:
                job = self.queue.get(timeout=max(deadline - time.monotonic(), 0)) if self.timeout_s else \
                    self.queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP or not first.joins(job) or rows + job.rows > self.max_batch:
                return batch, job
            batch.append(job)
            rows += job.rows
        return batch, None

    def _answer(self, batch: list[Job]) -> None:
        try:
            outputs = self._call(batch[0].signature, merge([job.inputs for job in batch]))
        except Exception as err:
            if len(batch) == 1:
                batch[0].future.set_exception(err)
                return
            for job in batch:  # one bad request must not fail the others: find it
                self._answer_alone(job)
            return
        start = 0
        for job in batch:
            job.future.set_result({name: array[start:start + job.rows] for name, array in outputs.items()})
            start += job.rows

    def _answer_alone(self, job: Job) -> None:
        try:
            job.future.set_result(self._call(job.signature, job.inputs))
        except Exception as err:
            job.future.set_exception(err)

    def _call(self, signature: str, inputs: Arrays) -> Arrays:
        self.on_batch(len(next(iter(inputs.values()))))
        return self.run(signature, inputs)


def merge(inputs: list[Arrays]) -> Arrays:
    """Concatenate requests along the batch axis: [{name: (rows_i, ...)}] -> {name: (sum rows_i, ...)}."""
    if len(inputs) == 1:
        return inputs[0]
    return {name: np.concatenate([each[name] for each in inputs]) for name in inputs[0]}
