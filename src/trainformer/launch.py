"""`trainformer launch --workers N -- train [CONFIG] [--set ...]`: N local worker processes,
one MultiWorkerMirroredStrategy run, talking over 127.0.0.1.

On a real cluster the scheduler sets TF_CONFIG and each node runs `trainformer train` itself
(README, "Many machines"); this does the same on one machine. Worker 0 is the chief, the
only one that writes the run directory. When a worker fails, the others are stopped (a
worker blocked in an all-reduce with a dead peer would otherwise wait for minutes), and no
worker outlives the launcher.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from trainformer.errors import UserError
from trainformer.quiet import debug_enabled

GRACE_S = 10.0  # a stopped worker's time to exit after SIGTERM before it is killed
POLL_S = 0.2
PR_SET_PDEATHSIG = 1
_OUTPUT = threading.Lock()  # one whole line at a time: the workers' relays and the launcher share `out`


def free_ports(count: int) -> list[int]:
    """Ports the OS considers free on 127.0.0.1 (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_config(ports: list[int], index: int) -> str:
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the launcher dies, even by kill -9 (Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _write_line(out, line: str) -> None:
    """Write one line whole. print() writes the text and its newline apart, and another thread's
    line could land between them."""
    with _OUTPUT:
        out.write(line if line.endswith("\n") else line + "\n")
        out.flush()


def _relay(stream, prefix: str, out) -> None:
    for line in stream:
        _write_line(out, prefix + line)


def launch(workers: int, command: list[str], out=sys.stdout, debug: bool | None = None) -> int:
    """Run `trainformer <command>` in `workers` processes; returns the exit status: 0 when all
    finished, else the first failing worker's. `debug` (default: whether this process got
    --debug) passes --debug on, so the workers show tracebacks and TensorFlow's logging too."""
    if workers < 1:
        raise UserError(f"launch --workers: must be >= 1, got {workers}")
    if not command or command[0] != "train":
        raise UserError("launch: expected the train command after '--', e.g. trainformer launch --workers 2 -- train")
    if debug is None:
        debug = debug_enabled()
    command = [*(["--debug"] if debug else []), *command, "--set", "train.strategy=multi_worker"]
    ports = free_ports(workers)
    processes = []
    # Ctrl-C and SIGTERM reach the workers (each finishes its step, all save the same step and
    # exit), not the launcher: from before the first starts, since a worker can be up and
    # printing before the launcher gets to its own line.
    previous = {sig: signal.signal(sig, lambda signum, frame: _forward(processes, signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for index in range(workers):
            env = {**os.environ, "TF_CONFIG": tf_config(ports, index)}
            # Its own session: a Ctrl-C at the terminal reaches the launcher only, which forwards
            # it once (twice would be a worker's "second Ctrl-C": stop at once, without saving).
            process = subprocess.Popen(
                [sys.executable, "-m", "trainformer", *command], env=env, text=True, start_new_session=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
            )
            # The chief's progress lines come through as they are; the others' are marked.
            prefix = "" if index == 0 else f"[worker {index}] "
            threading.Thread(target=_relay, args=(process.stdout, prefix, out), daemon=True).start()
            processes.append(process)
        _write_line(out, f"launch: {workers} workers on 127.0.0.1 ports {', '.join(map(str, ports))} "
                         f"(pids {', '.join(str(p.pid) for p in processes)})")
        return _supervise(processes, out)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(processes: list[subprocess.Popen], out) -> int:
    """Wait for every worker; when one fails, stop the rest."""
    while True:
        codes = [process.poll() for process in processes]
        failed = [(index, code) for index, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            # A worker killed by a signal is the cause; a peer that saw it is gone from a
            # collective exits with status 1 soon after, maybe before this poll: name the cause.
            index, code = min(failed, key=lambda failure: failure[1] > 0)
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            _write_line(out, f"launch: worker {index} {how}; stopping the others")
            _stop(processes)
            return code if code > 0 else 128 - code  # killed by signal N: 128 + N, as a shell says
        if all(code == 0 for code in codes):
            return 0
        time.sleep(POLL_S)


def _forward(processes: list[subprocess.Popen], signum: int) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signum)


def _stop(processes: list[subprocess.Popen]) -> None:
    _forward(processes, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
