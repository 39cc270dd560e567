"""The dynamic batcher on its own: merging, splitting back, limits, failures and shutdown.

The model here is a plain numpy function that records its calls: the batcher's contract is
"call run(signature, inputs) with merged batch-major arrays", whatever runs behind it.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from trainformer.serve.batching import Batcher, Closed, Overloaded


class Recorder:
    """run(): doubles `x`, remembers each call's row count; can be made slow or to fail."""

    def __init__(self, delay_s=0.0, fail_on=None):
        self.calls, self.delay_s, self.fail_on = [], delay_s, fail_on

    def __call__(self, signature, inputs):
        self.calls.append((signature, len(inputs["x"])))
        time.sleep(self.delay_s)
        if self.fail_on is not None and self.fail_on in inputs["x"]:
            raise ValueError("bad row")
        return {"y": inputs["x"] * 2, "sig": np.array([signature] * len(inputs["x"]))}


def rows(*values):
    return {"x": np.array(values, dtype=np.int64)}


def submit_together(batcher, requests):
    """Submit every request at once from its own thread; the outputs (or exceptions) in order."""
    barrier = threading.Barrier(len(requests))

    def one(request):
        barrier.wait()
        return batcher.submit(*request).result(timeout=10)

    with ThreadPoolExecutor(len(requests)) as pool:
        futures = [pool.submit(one, request) for request in requests]
        return [future.exception() or future.result() for future in futures]


def test_concurrent_requests_share_model_calls_and_get_their_own_rows_back():
    recorder = Recorder(delay_s=0.01)
    batcher = Batcher(recorder, max_batch=64, timeout_s=0.05)
    requests = [("sig", rows(i, 100 + i)) for i in range(20)]
    answers = submit_together(batcher, requests)
    batcher.close()
    for i, answer in enumerate(answers):
        np.testing.assert_array_equal(answer["y"], [2 * i, 2 * (100 + i)])
    assert sum(size for _, size in recorder.calls) == 40
    assert len(recorder.calls) < 20 / 2  # merged, not one call per request


def test_max_batch_one_turns_merging_off_and_no_call_exceeds_max_batch():
    off = Recorder(delay_s=0.005)
    batcher = Batcher(off, max_batch=1, timeout_s=0.02)
    submit_together(batcher, [("sig", rows(i, i)) for i in range(12)])
    batcher.close()
    assert [size for _, size in off.calls] == [2] * 12  # one call per request, never split

    capped = Recorder(delay_s=0.005)
    batcher = Batcher(capped, max_batch=5, timeout_s=0.02)
    submit_together(batcher, [("sig", rows(i)) for i in range(12)])
    batcher.close()
    assert max(size for _, size in capped.calls) <= 5
    assert len(capped.calls) <= 4  # 12 rows at most 5 a call: 3 calls when merged fully, 12 if not


def test_different_signatures_and_row_shapes_are_never_merged():
    recorder = Recorder()
    batcher = Batcher(recorder, max_batch=64, timeout_s=0.05)
    wide = {"x": np.ones([1, 3], np.int64)}
    narrow = {"x": np.ones([1, 2], np.int64)}
    answers = submit_together(batcher, [("a", rows(1)), ("b", rows(2)), ("a", wide), ("a", narrow)])
    batcher.close()
    assert [answer["sig"].tolist() for answer in answers] == [["a"], ["b"], ["a"], ["a"]]
    assert answers[2]["y"].shape == (1, 3) and answers[3]["y"].shape == (1, 2)


def test_a_failing_request_fails_alone():
    recorder = Recorder(fail_on=13)
    batcher = Batcher(recorder, max_batch=64, timeout_s=0.05)
    answers = submit_together(batcher, [("sig", rows(i)) for i in range(10, 16)])
    batcher.close()
    assert isinstance(answers[3], ValueError)
    assert [answer["y"].tolist() for i, answer in enumerate(answers) if i != 3] == [[20], [22], [24], [28], [30]]


def test_close_answers_everything_queued_then_refuses_new_work():
    recorder = Recorder(delay_s=0.02)
    batcher = Batcher(recorder, max_batch=2, timeout_s=0)
    futures = [batcher.submit("sig", rows(i)) for i in range(9)]
    batcher.close()  # returns once the worker is done
    assert [future.result(timeout=0)["y"].tolist() for future in futures] == [[2 * i] for i in range(9)]
    with pytest.raises(Closed):
        batcher.submit("sig", rows(1))


def test_a_full_queue_refuses_with_overloaded():
    gate = threading.Event()
    batcher = Batcher(lambda signature, inputs: gate.wait() and {"y": inputs["x"]}, max_batch=1,
                      timeout_s=0, max_queue=4)
    first = batcher.submit("sig", rows(0, 0))  # taken by the worker, which waits on the gate
    deadline = time.monotonic() + 5
    while batcher.queued_rows and time.monotonic() < deadline:
        time.sleep(0.001)
    waiting = [batcher.submit("sig", rows(1, 1)), batcher.submit("sig", rows(2, 2))]  # 4 rows queued
    with pytest.raises(Overloaded):
        batcher.submit("sig", rows(3))
    gate.set()
    batcher.close()
    assert [f.result()["y"].tolist() for f in [first, *waiting]] == [[0, 0], [1, 1], [2, 2]]
