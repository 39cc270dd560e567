"""The launcher's process handling (trainformer launch), with cheap stand-in workers.

The real `launch()` runs in a subprocess, as under `trainformer launch`, with `sys.executable`
pointed at a small script instead of Python, so each "worker" is that script given the
command line a real worker would get. What the launcher promises (README, "Many devices,
many machines"): Ctrl-C reaches every worker; when one fails the others get SIGTERM, then
SIGKILL GRACE_S later, and the launcher exits with the failed worker's status; workers die
with the launcher, even when it is killed with SIGKILL. Real two-worker runs are in
tests/train/test_distributed.py.
"""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from trainformer import launch

# A stand-in worker: says it is ready (with its pid and arguments), exits 0 on SIGINT, and
# sleeps. FAKE_WORKER=fail: worker 1 ignores SIGTERM, worker 0 then exits with status 3.
WORKER = """\
#!{python}
import json, os, signal, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
failing = os.environ.get("FAKE_WORKER") == "fail"

def on_sigint(signum, frame):
    print("got SIGINT", flush=True)
    sys.exit(0)

signal.signal(signal.SIGINT, on_sigint)
if failing and index == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.environ["FAKE_READY"], "w").close()
print("ready", os.getpid(), " ".join(sys.argv[1:]), flush=True)
if failing and index == 0:
    deadline = time.monotonic() + 30
    while not os.path.exists(os.environ["FAKE_READY"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(3)
time.sleep(60)
"""

# `trainformer launch --workers 2 -- train`, with the stand-in as the workers' interpreter.
LAUNCHER = ("import sys; from trainformer import launch as L; L.GRACE_S = float(sys.argv[2]); "
            "sys.executable = sys.argv[1]; sys.exit(L.launch(2, ['train']))")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def worker_script(tmp_path):
    worker = tmp_path / "worker"
    worker.write_text(WORKER.format(python=sys.executable))
    worker.chmod(0o755)
    return worker


class Launcher:
    """The stand-in `trainformer launch` process and its output lines, read in a thread."""

    def __init__(self, tmp_path, mode: str = "", grace_s: float = 10.0):
        worker = worker_script(tmp_path)
        env = {**os.environ, "FAKE_WORKER": mode, "FAKE_READY": str(tmp_path / "ready")}
        self.process = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(worker), str(grace_s)], env=env,
                                        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=lambda: [self.lines.put(line) for line in self.process.stdout],
                                       daemon=True)
        self.reader.start()
        self.worker_pids: list[int] = []

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.seen:
                if match := re.search(pattern, line):
                    return match
            try:
                self.seen.append(self.lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} in {self.seen}") from None

    def wait_until_ready(self) -> list[int]:
        """Both workers are running and have set up their signal handlers: their pids."""
        pids = self.wait_for(r"\(pids (\d+), (\d+)\)").groups()
        self.worker_pids = [int(pid) for pid in pids]
        assert self.wait_for(r"^ready (\d+) ").group(1) == pids[0]  # the chief's lines as they are
        assert self.wait_for(r"^\[worker 1\] ready (\d+) ").group(1) == pids[1]  # the others' marked
        return self.worker_pids

    def output(self, timeout: float = 30) -> str:
        self.process.wait(timeout=timeout)
        self.reader.join(timeout=5)  # it has read up to the end of the launcher's output
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)

    def clean_up(self) -> None:
        for pid in [self.process.pid, *self.worker_pids]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def start_launcher(tmp_path):
    started = []

    def start(mode: str = "", grace_s: float = 10.0) -> Launcher:
        started.append(Launcher(tmp_path, mode, grace_s))
        return started[-1]

    yield start
    for launcher in started:
        launcher.clean_up()


def test_workers_get_the_train_command_with_the_multi_worker_strategy(start_launcher):
    launcher = start_launcher()
    launcher.wait_until_ready()
    line = launcher.wait_for(r"^ready \d+ (.*)$").group(1)
    assert line == "-m trainformer train --set train.strategy=multi_worker"


def test_workers_die_with_the_launcher_even_by_kill_9(start_launcher):
    launcher = start_launcher()
    pids = launcher.wait_until_ready()
    assert all(alive(pid) for pid in pids)
    launcher.process.kill()  # no handler, no cleanup: only the kernel can stop the workers now
    launcher.process.wait()
    assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=5), "a worker outlived the launcher"


def test_ctrl_c_to_the_launcher_reaches_every_worker(start_launcher):
    launcher = start_launcher()
    launcher.wait_until_ready()
    launcher.process.send_signal(signal.SIGINT)  # to the launcher only: it must pass it on
    output = launcher.output()
    assert launcher.process.returncode == 0, output
    assert re.search(r"^got SIGINT$", output, re.M) and "[worker 1] got SIGINT" in output
    assert "Traceback" not in output


def test_a_failed_worker_stops_the_others_with_sigkill_after_the_grace_period(start_launcher):
    """Worker 0 exits 3; worker 1 ignores SIGTERM, so only the SIGKILL GRACE_S later ends it."""
    launcher = start_launcher(mode="fail", grace_s=1.5)
    pids = launcher.wait_until_ready()
    launcher.wait_for("launch: worker 0 exited with status 3; stopping the others")
    stopping = time.monotonic()
    launcher.process.wait(timeout=30)
    waited = time.monotonic() - stopping
    assert launcher.process.returncode == 3  # the failed worker's status
    assert 1.0 < waited < 5.0, waited  # ~GRACE_S: SIGTERM was ignored, SIGKILL ended it
    assert not alive(pids[1])


class Recorder:
    """An output stream that keeps each write() apart and yields the GIL after each, as a
    terminal's slower writes would, so a line written in two calls can be interleaved."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)
        time.sleep(0.001)

    def flush(self) -> None:
        pass


def test_every_output_line_is_written_whole(tmp_path, monkeypatch):
    """The launcher's own lines and the workers' relayed lines share one stream from several
    threads: a line written in two calls (print writes its newline apart) can have another
    thread's line land in the middle."""
    monkeypatch.setattr(launch, "GRACE_S", 0.5)
    monkeypatch.setattr(sys, "executable", str(worker_script(tmp_path)))
    monkeypatch.setenv("FAKE_WORKER", "fail")
    monkeypatch.setenv("FAKE_READY", str(tmp_path / "ready"))
    out = Recorder()
    assert launch.launch(2, ["train"], out=out) == 3
    assert wait_until(lambda: sum("ready" in text for text in out.writes) == 2, timeout=5), out.writes
    assert [text for text in out.writes if not (text.endswith("\n") and text.count("\n") == 1)] == []
    assert any(text.startswith("launch: 2 workers") for text in out.writes)


def python(code: str) -> subprocess.Popen:
    """A plain child that says when it is ready."""
    process = subprocess.Popen([sys.executable, "-c", f"{code}; print('ready', flush=True); time.sleep(30)"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    return process


def test_stop_sends_sigterm_then_sigkill_after_grace_s(monkeypatch):
    monkeypatch.setattr(launch, "GRACE_S", 1.0)
    polite = python("import time")
    stubborn = python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    try:
        started = time.monotonic()
        launch._stop([polite, stubborn])
        took = time.monotonic() - started
    finally:
        for process in (polite, stubborn):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    assert 0.9 < took < 4.0, took


def test_a_worker_killed_by_a_signal_is_named_over_a_peer_that_exited_after_it():
    """Worker 1 is killed; the chief, its collective broken, exits 1 before the launcher looks
    again (CI saw this race): the launcher names the kill, the cause, and exits 128 + 9."""
    chief = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    chief.wait()
    killed.wait()
    out = Recorder()
    assert launch._supervise([chief, killed], out) == 128 + signal.SIGKILL
    assert out.writes == ["launch: worker 1 was killed by SIGKILL; stopping the others\n"]
