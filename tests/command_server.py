"""`trainformer` commands forked from a process that has already imported TensorFlow, Keras and
trainformer, instead of started with `python -m trainformer`: each command is still a process
of its own (its own op determinism, signals, exit status and file descriptors), without the
~4 s of imports every new one pays (~70 `train` launches a suite). Those imports start no
thread of TensorFlow's and run no op, so forking after them is safe (numpy's OpenBLAS pool is
fork-aware); a command's checkpoints are bitwise those of `python -m trainformer` (the kill -9
chain's reference run in tests/train/test_resume.py is started that way to check it).

The server is this file run as a script, one per pytest worker (CommandServer). Over a Unix
socket a client sends one request, a length-prefixed pickle of (args, env, cwd), with the
file descriptors for the command's stdin, stdout and stderr; the server forks the command,
answers its pid (8 bytes) and, once it has ended, its exit status as subprocess gives it
(4 bytes: the code, or minus the signal). The server ends when its stdin closes, i.e. when the
pytest worker that started it is gone.

A command whose environment must be in place before the imports (PYTHONPATH, the log level
TensorFlow reads while it loads) is started the usual way: cli_helpers decides.
"""

import atexit
import os
import pickle
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

POLL_S = 0.02  # how often the server looks for ended commands between requests


def serve(listener: socket.socket) -> None:
    waiting: dict[int, socket.socket] = {}  # pid -> the connection that waits for its status
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [], POLL_S)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1 << 10):
            return  # the pytest worker is gone
        if listener in ready:
            conn, _ = listener.accept()
            args, env, cwd, fds = receive_request(conn)
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                run_command(args, env, cwd, fds)  # never returns
            for fd in fds:
                os.close(fd)
            conn.sendall(struct.pack("!q", pid))
            waiting[pid] = conn
        reap(waiting)


def reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = waiting.pop(pid)
        try:
            conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
        except OSError:
            pass  # the client stopped waiting
        conn.close()


def run_command(args: list[str], env: dict, cwd: str, fds: list[int]) -> None:
    """In the forked child: become `python -m trainformer ARGS` in cwd with env and these
    stdin/stdout/stderr, run it, and exit as that process would."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[0] = cwd  # as `python -m` has it
        sys.argv = [os.path.join(os.path.dirname(cli.__file__), "__main__.py"), *args]
        try:
            cli.command()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        # what the interpreter does at exit: wait for the threads, run the exit hooks, flush
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def send_request(sock: socket.socket, args: list[str], env: dict, cwd: str, fds: list[int]) -> None:
    payload = pickle.dumps((list(args), dict(env), cwd))
    socket.send_fds(sock, [struct.pack("!I", len(payload)) + payload], fds)


def receive_request(conn: socket.socket) -> tuple[list[str], dict, str, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    (size,) = struct.unpack("!I", data[:4])
    data = data[4:]
    args, env, cwd = pickle.loads(data + receive_exactly(conn, size - len(data)))
    return args, env, cwd, fds


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other end of the command socket is gone")
        data += chunk
    return data


class ForkedProcess:
    """What the tests use of subprocess.Popen, for a command the server forked."""

    def __init__(self, args: list[str], conn: socket.socket, stdout):
        self.args = args
        self.conn = conn
        self.stdout = stdout  # a text file when stdout=subprocess.PIPE, else None
        self.pid = struct.unpack("!q", receive_exactly(conn, 8))[0]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_status()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, None]:
        """The rest of stdout (read to its end, in a thread so that timeout holds) and the wait."""
        start, out = time.monotonic(), []
        if self.stdout is not None:
            reader = threading.Thread(target=lambda: out.append(self.stdout.read()), daemon=True)
            reader.start()
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.stdout.close()
        self.wait(None if timeout is None else max(0.0, timeout - (time.monotonic() - start)))
        return (out[0] if out else None), None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def _read_status(self) -> None:
        self.returncode = struct.unpack("!i", receive_exactly(self.conn, 4))[0]
        self.conn.close()


def file_descriptor(target, null, stdout: int | None = None) -> int:
    """The descriptor of a Popen stdout/stderr argument: a file, DEVNULL or None (null), or
    subprocess.STDOUT (stderr only: the descriptor `stdout`)."""
    if target == subprocess.STDOUT and stdout is not None:
        return stdout
    return null.fileno() if target in (None, subprocess.DEVNULL) else target.fileno()


class CommandServer:
    """This pytest worker's server, started on first use (or by start() ahead of it)."""

    def __init__(self, env: dict):
        self.env = env
        self.process: subprocess.Popen | None = None
        self.socket_path = ""
        self.ready = False

    def start(self) -> None:
        if self.process is None:
            self.socket_path = os.path.join(tempfile.mkdtemp(prefix="trainformer-commands-"), "socket")
            self.process = subprocess.Popen([sys.executable, __file__, self.socket_path], env=self.env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            atexit.register(self.stop)

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=10)
        shutil.rmtree(os.path.dirname(self.socket_path), ignore_errors=True)

    def popen(self, args: list[str], env: dict, stdout=None, stderr=None) -> ForkedProcess:
        """Fork `trainformer ARGS` with env. stdout and stderr as subprocess.Popen takes them (a
        file, DEVNULL, PIPE for stdout, STDOUT for stderr), except that None is /dev/null: the
        command server's own stdout is its handshake."""
        self.start()
        if not self.ready:
            line = self.process.stdout.readline()
            assert line == b"ready\n", f"the command server did not start: {line!r}"
            self.ready = True
        with open(os.devnull, "r+b") as null:
            pipe = os.pipe() if stdout == subprocess.PIPE else None
            out = pipe[1] if pipe else file_descriptor(stdout, null)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(self.socket_path)
            send_request(conn, args, env, os.getcwd(), [null.fileno(), out, file_descriptor(stderr, null, out)])
        if pipe:
            os.close(pipe[1])  # the command holds the only writing end: its exit is our end of file
        return ForkedProcess(["trainformer", *args], conn, open(pipe[0]) if pipe else None)

    def run(self, args: list[str], env: dict) -> subprocess.CompletedProcess:
        """subprocess.run(["trainformer", *args], capture_output=True, text=True), forked."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            code = self.popen(args, env, stdout=out, stderr=err).wait()
            texts = []
            for file in (out, err):
                file.seek(0)
                texts.append(file.read().decode().replace("\r\n", "\n").replace("\r", "\n"))
        return subprocess.CompletedProcess(["trainformer", *args], code, *texts)


if __name__ == "__main__":
    import importlib
    import pkgutil

    from trainformer import framework_import

    framework_import.install()
    import trainformer
    from trainformer import cli

    for module in pkgutil.walk_packages(trainformer.__path__, "trainformer."):  # all any verb imports
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sys.argv[1])
    listener.listen(64)
    print("ready", flush=True)
    serve(listener)
