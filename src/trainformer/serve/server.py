"""`trainformer serve MODEL_DIR`: check the model and the port, then run the app under uvicorn
until SIGTERM or Ctrl-C, which stop taking connections, let every request in flight finish
(the batcher answers all it has queued) and exit 0."""

from __future__ import annotations

import logging
import re
import signal
import socket
import sys
from pathlib import Path

from trainformer.errors import UserError
from trainformer.serve.app import Limits, create_app
from trainformer.serve.batching import Batcher
from trainformer.serve.metrics import ServeMetrics
from trainformer.serve.model import ServedModel, first_line, read_metadata

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # it sits in URL paths, before ":predict"
GRACE_S = 30  # the most a shutdown waits for requests in flight


def serve(model_dir: Path, host: str = "127.0.0.1", port: int = 8501, name: str | None = None, *,
          max_batch: int = 64, batch_timeout_ms: float = 0.0, max_queue: int = 4096,
          limits: Limits = Limits(), access_log: bool = False) -> int:
    """Serve MODEL_DIR (a `trainformer export` folder) until stopped; the exit status."""
    check_name(name)
    check_settings(max_batch, batch_timeout_ms, max_queue, limits)
    name = name or default_name(model_dir, read_metadata(model_dir))  # a wrong folder fails before TensorFlow loads
    listener = bind(host, port)
    model = ServedModel.load(model_dir)
    warm_up(model)
    metrics = ServeMetrics()
    batcher = Batcher(lambda signature, inputs: model.signatures[signature](inputs), max_batch,
                      batch_timeout_ms / 1000, max_queue, on_batch=metrics.batch)
    app = create_app(model, name, batcher, metrics, limits)
    show_log()
    bound_host, bound_port = listener.getsockname()[:2]
    url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    print(f"serving {name} ({model.task}, step {model.version}) on http://{url_host}:{bound_port}/v1/models/{name}",
          flush=True)
    run_uvicorn(app, listener, access_log)
    print(f"stopped serving {name}", flush=True)
    return 0


def check_name(name: str | None) -> None:
    if name is not None and not NAME.fullmatch(name):
        raise UserError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it goes in the URL)")


def default_name(model_dir: Path, metadata: dict) -> str:
    """The exported run's name (runs/zh-bert-tiny/export serves zh-bert-tiny, not "export"),
    else the folder's; "model" when neither can stand in a URL."""
    for candidate in (metadata.get("run"), model_dir.resolve().name):
        if isinstance(candidate, str) and NAME.fullmatch(candidate):
            return candidate
    return "model"


def check_settings(max_batch: int, batch_timeout_ms: float, max_queue: int, limits: Limits) -> None:
    for flag, value in (("--max-batch", max_batch), ("--max-queue", max_queue),
                        ("--max-instances", limits.max_instances), ("--max-body-mb", limits.max_body_bytes)):
        if value < 1:
            raise UserError(f"{flag} must be positive, not {value}")
    if not 0 <= batch_timeout_ms <= 10_000:
        raise UserError(f"--batch-timeout-ms must be between 0 and 10000, not {batch_timeout_ms}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, taken before the model loads: a busy port is one line."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: not a port number (0-65535; 0 picks a free one)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise UserError(f"--host {host}: {err.strerror}") from None
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and without
    # it each response's body waits on Nagle and the client's delayed ACK (~40 ms a request)
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not a live listener: only TIME_WAIT
    try:
        listener.bind(address)
        listener.listen(2048)
    except OSError as err:
        listener.close()
        raise UserError(f"cannot listen on {host}:{port}: {err.strerror} (is another server on it? "
                        "pick another --port)") from None
    return listener


def warm_up(model: ServedModel) -> None:
    """One real call before saying "serving": the first is slow, and a model that cannot answer
    is a bad MODEL_DIR, not a server that fails every request."""
    signature = model.signatures["serving_default"]
    if [info.is_text for info in signature.inputs.values()] != [True]:
        return
    import numpy as np

    try:
        signature({next(iter(signature.inputs)): np.array([b"warm up"], dtype=object)})
    except Exception as err:
        raise UserError(f"{model.model_dir}: the model fails on a first text: {first_line(err)}") from err


def show_log() -> None:
    """The server's own log lines (model failures) go to stderr."""
    log = logging.getLogger("trainformer.serve")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def run_uvicorn(app, listener: socket.socket, access_log: bool) -> None:
    import uvicorn

    config = uvicorn.Config(app, log_level="info" if access_log else "warning", access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=GRACE_S, server_header=False)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it is done: with these handlers that is
    # a no-op, so a graceful stop exits 0 instead of dying of the signal afterwards.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda signum, frame: None)
    server.run(sockets=[listener])
