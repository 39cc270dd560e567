"""The real `trainformer serve` in a process of its own, for the serve tests."""

import re
import signal
import subprocess

import httpx
from cli_helpers import start

START = re.compile(r"serving (\S+) \((\w+), version (\d+)\) on (http://127\.0\.0\.1:\d+)/v1/models/\1"
                   r"(?:, gRPC (127\.0\.0\.1:\d+))?\n")


def highest(base):
    return max((child for child in base.iterdir() if child.name.isdigit()), key=lambda child: int(child.name))


class Server:
    """`trainformer serve ARGS --port 0 --grpc-port 0` in a process of its own; every start line parsed
    (`models`: name -> (task, version, REST model URL)), `root` and `grpc` of the first."""

    def __init__(self, *args, log_path, models=1):
        self.log = open(log_path, "w")
        self.log_path = log_path
        self.process = start("serve", *map(str, args), "--port", "0",
                             *([] if "--no-grpc" in args else ["--grpc-port", "0"]), stdout=subprocess.PIPE, stderr=self.log)
        self.models = {}
        for _ in range(models):  # printed once the ports are bound and every model answers
            line = self.process.stdout.readline()
            found = START.fullmatch(line)
            assert found, f"start line {line!r}; log: {open(log_path).read()}"
            name, task, version, self.root, self.grpc = found.groups()
            self.models[name] = (task, int(version), f"{self.root}/v1/models/{name}")
        self.name = next(iter(self.models))
        self.model = self.models[self.name][2]
        self.client = httpx.Client(timeout=30)

    def predict(self, payload=None, content=None, model=None):
        return self.client.post(f"{model or self.model}:predict", json=payload, content=content)

    def stop(self):
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
        self.log.close()
