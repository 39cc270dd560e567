"""Keep TensorFlow's own logging off the terminal unless --debug.

TF_CPP_MIN_LOG_LEVEL=2 hides TensorFlow's INFO and WARNING lines, but not all of them: lines
logged while its libraries load (before absl::InitializeLog, e.g. the oneDNN and "Could not
find cuda drivers" notices) ignore it, and some ERROR lines are harmless (no CUDA driver, the
DT_INT64 oneDNN fallback, a multi-worker peer that already finished). Raising the level to 3
would also hide TensorFlow's real errors, so instead fd 2 is rerouted through a small filter
process that drops exactly those lines and passes everything else through unchanged: Python
tracebacks, our own messages, a fatal TensorFlow error. The filter is a process, not a thread,
so what a crashing process wrote last (a fatal check, faulthandler's dump) is still shown;
it ignores Ctrl-C and SIGTERM and exits when every writer has closed its end. Processes started
from here (launch's workers) inherit the filtered fd 2 and TF_CPP_MIN_LOG_LEVEL.

TF_ENABLE_ONEDNN_OPTS is left alone: it changes numerics and speed; only its notice is hidden.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import signal
import sys

LEVEL_VAR = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "2"  # TensorFlow's own threshold: INFO and WARNING hidden, ERROR shown

# absl/glog record: "I0000 00:00:1796058388.788699    3479 port.cc:153] ...", and TF's older
# "2024-01-02 03:04:05.678901: W tensorflow/core/...cc:12] ..." form.
RECORD = re.compile(rb"^(?:(?P<sev>[IWEF])\d{4} \d\d:\d\d:[\d.]+ +\d+ [^\s\]]+:\d+\] "
                    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:[\d.]+: (?P<sev2>[IWEF]) [^\s\]]+:\d+\] )")
SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}

# Lines that are never worth showing without --debug, whatever their severity.
HARMLESS = [re.compile(pattern) for pattern in (
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    # No CUDA driver on this machine: the devices line already says CPU.
    rb"\] failed call to cuInit: ",
    # oneDNN's int64 kernels need AVX-512: Eigen's are used instead.
    rb"\] oneDNN supports DT_INT64 only on platforms with AVX-512",
    # A multi-worker peer that left first (e.g. the chief, done with the run): this process's
    # collectives are aborted. If one was still needed, it fails with this same message as a
    # Python exception, which is shown; if not, the run succeeded and the line only alarms.
    rb"\] BaseCollectiveExecutor::StartAbort ",
    # Length-bucketed classification batches come in a few widths, one trace each, by design.
    rb"^WARNING:tensorflow:\d+ out of the last \d+ calls to .* triggered tf\.function retracing",
    # LiteRT's interpreter saying it uses its default CPU kernels (export's parity check).
    rb"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.$",
)]

# A line that begins something new (so it is never taken for the tail of a dropped record).
START = re.compile(rb"^(?:Traceback \(most recent call last\):|trainformer\b|WARNING:|Fatal Python error"
                   rb"|\[worker \d+\] |\S+\.py:\d+: \w*Warning: )")

STALL_S = 0.05  # a line without its newline for this long (a prompt, a progress bar) is shown as is
SYNC = b"\x00trainformer-stderr-sync\x00\n"  # from the process at exit: "tell me when all is out"
SYNC_TIMEOUT_S = 2.0

_state: dict = {"debug": False, "installed": False}


def quiet_tensorflow(debug: bool) -> None:
    """Call first thing, before TensorFlow is imported. Without `debug`: TensorFlow's threshold
    at ERROR unless TF_CPP_MIN_LOG_LEVEL is already set, and stderr filtered (see module doc).
    With `debug`: nothing changes, everything shows; launch passes --debug on to its workers."""
    _state["debug"] = debug
    if debug:
        return
    os.environ.setdefault(LEVEL_VAR, DEFAULT_LEVEL)
    install_stderr_filter(min_level(os.environ[LEVEL_VAR]))


def debug_enabled() -> bool:
    """Whether this process was started with --debug (set by quiet_tensorflow)."""
    return _state["debug"]


def min_level(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


class LineFilter:
    """Bytes in, bytes out: drops TensorFlow's INFO/WARNING records below `level` (which it
    failed to drop itself) and the HARMLESS lines; every other line passes unchanged. A
    dropped record's continuation lines (the rest of a multi-line message, written with it in
    one piece) go too, up to the first line that starts something new."""

    def __init__(self, level: int = int(DEFAULT_LEVEL)):
        self.level = level
        self.partial = b""  # a line without its newline yet
        self.shown = False  # the start of `partial` has already been passed through

    def drop(self, line: bytes) -> bool:
        match = RECORD.match(line)
        if match and SEVERITY[match.group("sev") or match.group("sev2")] < min(self.level, 3):
            return True
        return any(pattern.search(line) for pattern in HARMLESS)

    def feed(self, data: bytes) -> bytes:
        """Complete lines of `data` that pass; an unfinished last line is kept for later."""
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out, dropping = [], False
        for line in lines:
            if self.shown:  # the rest of a line whose start is out already
                self.shown = False
                out.append(line + b"\n")
                dropping = False
                continue
            starts = RECORD.match(line) or START.match(line) or not line.strip()
            if dropping and not starts:
                continue
            dropping = self.drop(line)
            if not dropping:
                out.append(line + b"\n")
        return b"".join(out)

    def stall(self) -> bytes:
        """The unfinished line has waited long enough: show what there is of it."""
        out, self.partial = self.partial, b""
        self.shown = self.shown or bool(out)
        return out

    def close(self) -> bytes:
        out = self.partial
        self.partial = b""
        return out if self.shown or not self.drop(out) else b""


def install_stderr_filter(level: int) -> bool:
    """Route fd 2 of this process (and of the processes it starts) through a LineFilter in a
    child process. Returns False where that is not possible (no fork, no usable fd 2)."""
    if _state["installed"] or not hasattr(os, "fork"):
        return False
    try:
        os.fstat(2)
    except OSError:
        return False
    pipes = [*os.pipe(), *os.pipe()]
    if min(pipes) < 3:  # fd 0 or 1 was closed: leave such a process alone
        for fd in pipes:
            os.close(fd)
        return False
    data_r, data_w, ack_r, ack_w = pipes
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    if os.fork() == 0:  # the filter
        try:
            _run_filter(data_r, ack_w, level)
        finally:
            os._exit(0)
    os.close(data_r)
    os.close(ack_w)
    os.dup2(data_w, 2)  # inheritable: worker processes write through it too
    os.close(data_w)
    _state["installed"] = True
    atexit.register(_drain, os.getpid(), _identity(2), ack_r)
    return True


def _run_filter(data_r: int, ack_w: int, level: int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # outlive the process it serves, to show its last words
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # hold no one's stdout pipe open
    keep = sorted({data_r, ack_w})
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 1 << 20)
    pump(data_r, 2, LineFilter(level), ack_w)


def pump(source: int, target: int, line_filter: LineFilter, ack: int | None = None) -> None:
    """Copy `source` to `target` through `line_filter` until end of file. On SYNC, everything
    before it is written out and one byte is sent on `ack`."""
    buffer = b""
    while True:
        if line_filter.partial and not select.select([source], [], [], STALL_S)[0]:
            _write(target, line_filter.stall())
        chunk = os.read(source, 1 << 16)
        if not chunk:
            break
        buffer += chunk
        while (at := buffer.find(SYNC)) >= 0:
            _write(target, line_filter.feed(buffer[:at]) + line_filter.stall())
            buffer = buffer[at + len(SYNC):]
            if ack is not None:
                _write(ack, b"\x01")
        hold = _sync_prefix(buffer)  # the start of a SYNC split across reads
        _write(target, line_filter.feed(buffer[:len(buffer) - hold]))
        buffer = buffer[len(buffer) - hold:]
    _write(target, line_filter.feed(buffer) + line_filter.close())


def _sync_prefix(buffer: bytes) -> int:
    for size in range(min(len(SYNC) - 1, len(buffer)), 0, -1):
        if buffer.endswith(SYNC[:size]):
            return size
    return 0


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:  # the reader is gone: keep draining, as /dev/null would
            return


def _identity(fd: int) -> tuple[int, int]:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino


def _drain(owner: int, pipe: tuple[int, int], ack_r: int) -> None:
    """At exit: wait until the filter has written out everything so far (so the shell prompt
    comes after our last line). Later output (interpreter teardown) is still filtered."""
    if os.getpid() != owner:  # a forked child running our atexit hooks
        return
    try:
        if _identity(2) != pipe:  # fd 2 was pointed elsewhere since (a host process's output capture)
            return
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        _write(2, SYNC)
        if select.select([ack_r], [], [], SYNC_TIMEOUT_S)[0]:
            os.read(ack_r, 1)
    except (OSError, ValueError):
        pass
