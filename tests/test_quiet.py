"""TensorFlow's own logging stays off the terminal unless --debug (trainformer/quiet.py), and
nothing else is lost: our messages, tracebacks, TensorFlow's real errors, a crash's last words.

The commands run with a clean environment (cli_helpers.CLEAN_ENV: no TF_CPP_MIN_LOG_LEVEL, unlike
cli_helpers.ENV): what a user who just installed trainformer sees. Two more end-to-end checks
ride on runs that other tests make anyway, in that same environment (a TensorFlow start-up
each saved): a training run prints nothing on stderr (tests/test_cli.py, the shared run), and
`launch` relays its workers without TensorFlow's logging (tests/train/test_distributed.py,
the two-worker run)."""

import io
import subprocess
import sys

import pytest
from cli_helpers import CLEAN_ENV, TINY, trainformer

from trainformer import launch as launch_module
from trainformer.quiet import SYNC, LineFilter

ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def too_big_batch(tmp_path, vocab_args) -> list[str]:
    """A train command that fails with a UserError after TensorFlow has loaded and run ops."""
    return ["train", "--run-dir", str(tmp_path / "run"), *TINY, *vocab_args, "--set", "train.batch_size=1000000"]


def test_a_user_error_after_tensorflow_loaded_is_one_line(tmp_path, vocab_args):
    result = trainformer(*too_big_batch(tmp_path, vocab_args), check=False, env=CLEAN_ENV)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("trainformer: error: train.batch_size: 1000000 is more than the")
    assert "training windows" in result.stderr  # it names what there is too little of
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_debug_shows_tensorflow_logging_and_the_traceback(tmp_path, vocab_args):
    result = trainformer("--debug", *too_big_batch(tmp_path, vocab_args), check=False, env=CLEAN_ENV)
    assert result.returncode == 1
    assert ABSL in result.stderr.splitlines()  # TensorFlow did load, and says so again
    assert "Traceback (most recent call last)" in result.stderr
    assert "UserError: train.batch_size: 1000000" in result.stderr


class FakeWorker:
    def __init__(self, args, **kwargs):
        self.args, self.pid, self.stdout = args, 0, io.StringIO("")
        started.append(args)

    def poll(self):
        return 0


started: list[list[str]] = []


@pytest.mark.parametrize("debug", [False, True])
def test_launch_passes_debug_on_to_its_workers(monkeypatch, debug):
    monkeypatch.setattr(launch_module.subprocess, "Popen", FakeWorker)
    started.clear()
    assert launch_module.launch(2, ["train", "--set", "train.steps=3"], out=io.StringIO(), debug=debug) == 0
    assert len(started) == 2
    for args in started:
        assert args[1:3] == ["-m", "trainformer"]
        assert args[3:5] == (["--debug", "train"] if debug else ["train", "--set"])


FILTERED = r"""
import os, sys
from trainformer.quiet import quiet_tensorflow
quiet_tensorflow(debug=sys.argv[1] == "debug")
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
            b"I0000 00:00:1796058887.627778    9266 port.cc:153] oneDNN custom operations are on.\n"
            b"E0000 00:00:1796058898.424717    9266 util.cc:131] oneDNN supports DT_INT64 only on platforms "
            b"with AVX-512. Falling back to the default Eigen-based implementation if present.\n"
            b"E0000 00:00:1796058898.424717    9266 gpu_device.cc:1] a real error\n")
print("a line of ours", file=sys.stderr, flush=True)
os.write(2, b"F0000 00:00:1796058898.424717    9266 foo.cc:1] Check failed: x\n")
os.abort()
"""


def test_the_stderr_filter_passes_real_lines_even_from_a_crashing_process():
    result = subprocess.run([sys.executable, "-c", FILTERED, "quiet"], capture_output=True, text=True, env=CLEAN_ENV,
                            timeout=60)
    assert result.returncode == -6  # SIGABRT
    assert result.stderr.splitlines() == [
        "E0000 00:00:1796058898.424717    9266 gpu_device.cc:1] a real error",
        "a line of ours",
        "F0000 00:00:1796058898.424717    9266 foo.cc:1] Check failed: x",  # written just before abort()
    ]
    debug = subprocess.run([sys.executable, "-c", FILTERED, "debug"], capture_output=True, text=True, env=CLEAN_ENV,
                           timeout=60)
    assert len(debug.stderr.splitlines()) == 6 and ABSL in debug.stderr


# A host process (pytest's capture, a notebook) calls main() in-process, which installs the filter,
# then points fd 2 back at its own stderr before it exits.
REPOINTED = """
import os, sys
from trainformer.quiet import quiet_tensorflow
own = os.dup(2)
quiet_tensorflow(debug=False)
print("filtered", file=sys.stderr, flush=True)
os.dup2(own, 2)
print("the host's own", file=sys.stderr, flush=True)
"""


def test_the_exit_sends_its_marker_only_to_its_own_filter():
    """The marker that asks the filter to drain (quiet.SYNC) was printed on the host's stderr
    after pytest's summary, and the exit waited its 2 s for an answer that never came."""
    result = subprocess.run([sys.executable, "-c", REPOINTED], capture_output=True, env=CLEAN_ENV, timeout=60)
    assert result.returncode == 0 and SYNC not in result.stderr
    assert b"filtered" in result.stderr and b"the host's own" in result.stderr  # two writers: in any order


# Worker 1's stderr when the chief had finished first (TF 2.21): one record over three lines.
START_ABORT = (
    b"E0000 00:00:1796058651.167343    6357 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort "
    b"UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted "
    b"unexpectedly or this task is experiencing network issues. Check earlier logs from 1) this task, 2) the leader "
    b"(usually slice 0 task 0), and 3) cluster scheduler to debug further.\n"
    b"Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling "
    b"/tensorflow.CoordinationService/Heartbeat:\n"
    b':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all addresses"}\n'
)


def test_a_dropped_record_takes_its_continuation_lines_and_nothing_after_them():
    traceback = b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
    assert LineFilter().feed(START_ABORT) == b""
    assert LineFilter().feed(START_ABORT + traceback) == traceback
    assert LineFilter().feed(START_ABORT + b"trainformer: error: x\n") == b"trainformer: error: x\n"
    later = LineFilter()  # a line in a later write is not a continuation
    assert later.feed(START_ABORT) == b"" and later.feed(b"something else\n") == b"something else\n"


def test_tensorflow_level_is_respected_and_unfinished_lines_are_not_held_back():
    info = b"I0000 00:00:1796058887.627778    9266 port.cc:153] oneDNN custom operations are on.\n"
    warning = b"W0000 00:00:1796058495.852799    4466 dataset.cc:997] Input of GeneratorDatasetOp::Dataset\n"
    error = b"E0000 00:00:1796058489.003823    4464 some.cc:52] a real error\n"
    assert LineFilter(level=2).feed(info + warning + error) == error
    assert LineFilter(level=1).feed(info + warning + error) == warning + error
    assert LineFilter(level=0).feed(info + warning + error) == info + warning + error  # TF_CPP_MIN_LOG_LEVEL=0 set
    assert LineFilter(level=3).feed(error + b"F0000 00:00:1.0 1 x.cc:1] fatal\n") == b"F0000 00:00:1.0 1 x.cc:1] fatal\n"
    prompt = LineFilter()
    assert prompt.feed(b"Continue? [y/N] ") == b"" and prompt.stall() == b"Continue? [y/N] "
    assert prompt.feed(b"y\n") == b"y\n" and prompt.close() == b""
    unfinished = LineFilter()
    assert unfinished.feed(b"no newline at exit") == b"" and unfinished.close() == b"no newline at exit"
