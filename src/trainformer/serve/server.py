"""`trainformer serve BASE` / `--model NAME=BASE`: check the base paths and the ports, load each
model's highest version, then run the REST app under uvicorn and the gRPC server beside it
until SIGTERM or Ctrl-C, which stop taking connections, let every request in flight finish
(the batcher answers all it has queued) and exit 0."""

from __future__ import annotations

import logging
import re
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from trainformer.errors import UserError
from trainformer.serve.app import Limits, create_app
from trainformer.serve.batching import Batcher
from trainformer.serve.metrics import ServeMetrics
from trainformer.serve.model import read_metadata
from trainformer.serve.versions import ModelVersions, Registry, check_base

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # it sits in URL paths, before ":predict"
GRACE_S = 30  # the most a shutdown waits for requests in flight


@dataclass(frozen=True)
class Settings:
    """How the server listens and batches (the CLI's flags)."""

    host: str = "127.0.0.1"
    port: int = 8501
    grpc_port: int | None = 8500  # None: no gRPC
    max_batch: int = 64
    batch_timeout_ms: float = 0.0
    max_queue: int = 4096
    poll_seconds: float = 1.0
    limits: Limits = Limits()
    access_log: bool = False


def serve(models: dict[str | None, Path], settings: Settings = Settings()) -> int:
    """Serve each base path under its name (None: the exported run's) until stopped; the exit status."""
    check_settings(settings)
    named = model_names(models)  # a wrong folder fails before TensorFlow loads
    listener = bind(settings.host, settings.port)
    registry = Registry({name: ModelVersions(name, base, settings.limits.max_instances)
                         for name, base in named.items()}, settings.poll_seconds)
    metrics = ServeMetrics()
    # the batcher's key is the Signature object itself: a version's calls never merge with another's
    batcher = Batcher(lambda signature, inputs: signature(inputs), settings.max_batch,
                      settings.batch_timeout_ms / 1000, settings.max_queue, on_batch=metrics.batch)
    grpc_server, grpc_address = start_grpc(registry, batcher, metrics, settings)  # a busy port fails before loading
    for model in registry.models.values():
        model.load_first()
    stop_grpc = (lambda: grpc_server.stop(GRACE_S).wait()) if grpc_server else None
    app = create_app(registry, batcher, metrics, settings.limits, on_shutdown=stop_grpc)
    show_log()
    registry.start()
    root = url_root(listener)
    for name, model in registry.models.items():
        grpc_part = f", gRPC {grpc_address}" if grpc_address else ""
        print(f"serving {name} ({model.latest.model.task}, version {model.latest.number}) on "
              f"{root}/v1/models/{name}{grpc_part}", flush=True)
    run_uvicorn(app, listener, settings.access_log)
    print(f"stopped serving {', '.join(registry.models)}", flush=True)
    return 0


def model_names(models: dict[str | None, Path]) -> dict[str, Path]:
    """{name: base path}, each name checked and unique; an unnamed base is named by its export."""
    named: dict[str, Path] = {}
    for name, base in models.items():
        check_name(name)
        highest = check_base(base)
        name = name or default_name(base, read_metadata(base / str(highest)))
        if name in named:
            raise UserError(f"two models named {name!r} ({named[name]} and {base}): name them with --model NAME=BASE")
        named[name] = base
    return named


def start_grpc(registry: Registry, batcher: Batcher, metrics: ServeMetrics, settings: Settings):
    """The gRPC server and the address it listens on, or (None, None) with --no-grpc."""
    if settings.grpc_port is None:
        return None, None
    if settings.grpc_port:  # checked here: gRPC's own failure to bind also logs a C++ line on stderr
        bind(settings.host, settings.grpc_port, flag="--grpc-port", what="gRPC").close()
    from trainformer.serve import rpc

    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    server, port = rpc.start(registry, batcher, metrics, f"{host}:{settings.grpc_port}",
                             settings.limits.max_instances, settings.limits.max_body_bytes)
    return server, f"{host}:{port}"


def url_root(listener: socket.socket) -> str:
    bound_host, bound_port = listener.getsockname()[:2]
    url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    return f"http://{url_host}:{bound_port}"


def check_name(name: str | None) -> None:
    if name is not None and not NAME.fullmatch(name):
        raise UserError(f"model name {name!r}: use letters, digits, '.', '_' and '-' (it goes in the URL)")


def default_name(base: Path, metadata: dict) -> str:
    """The exported run's name (runs/zh-bert-tiny/export serves zh-bert-tiny, not "export"),
    else the base folder's; "model" when neither can stand in a URL."""
    for candidate in (metadata.get("run"), base.resolve().name):
        if isinstance(candidate, str) and NAME.fullmatch(candidate):
            return candidate
    return "model"


def check_settings(settings: Settings) -> None:
    limits = settings.limits
    for flag, value in (("--max-batch", settings.max_batch), ("--max-queue", settings.max_queue),
                        ("--max-instances", limits.max_instances), ("--max-body-mb", limits.max_body_bytes)):
        if value < 1:
            raise UserError(f"{flag} must be positive, not {value}")
    if not 0 <= settings.batch_timeout_ms <= 10_000:
        raise UserError(f"--batch-timeout-ms must be between 0 and 10000, not {settings.batch_timeout_ms}")
    if not 0 < settings.poll_seconds <= 3600:
        raise UserError(f"--poll-seconds must be above 0 and at most 3600, not {settings.poll_seconds}")


def bind(host: str, port: int, flag: str = "--port", what: str = "") -> socket.socket:
    """A listening socket on host:port, taken before the model loads: a busy port is one line."""
    if not 0 <= port <= 65535:
        raise UserError(f"{flag} {port}: not a port number (0-65535; 0 picks a free one)")
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
        raise UserError(f"cannot listen{' for ' + what if what else ''} on {host}:{port}: {err.strerror} "
                        f"(is another server on it? pick another {flag})") from None
    return listener


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
