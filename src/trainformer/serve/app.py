"""The FastAPI app: TF Serving's REST API (model status with every version, metadata, predict,
each also under /versions/N) plus /healthz and /metrics. Every answer, errors included, is JSON
in TF Serving's shapes ({"error": "..."}); input problems are 4xx with one clear line, never
500; a model failure is a 500 that says only that, while the server log gets the traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from trainformer.serve.batching import Batcher, Closed, Overloaded
from trainformer.serve.metrics import ServeMetrics
from trainformer.serve.model import ModelInputError, ServedModel
from trainformer.serve.protocol import ClientError, decode_body, own_masks, parse_predict, predict_response
from trainformer.serve.versions import Registry, parse_version, submit

log = logging.getLogger("trainformer.serve")


@dataclass(frozen=True)
class Limits:
    """What one request may ask for."""

    max_body_bytes: int = 4 << 20
    max_instances: int = 1024


def json_response(payload: dict, status: int = 200, headers: dict | None = None) -> Response:
    # allow_nan: a model's NaN comes out as TF Serving writes it, rather than as a 500
    body = json.dumps(payload, ensure_ascii=False, allow_nan=True).encode("utf-8")
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error(status: int, message: str, headers: dict | None = None) -> Response:
    return json_response({"error": message}, status, headers)


def create_app(registry: Registry, batcher: Batcher, metrics: ServeMetrics, limits: Limits = Limits(),
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The app serving every model of `registry`; `batcher` makes their model calls and is
    closed (queued work finished) when the app shuts down, after `on_shutdown` (the gRPC server
    stopping: its requests share the batcher)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        # uvicorn has let in-flight requests finish first
        registry.stop()
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)
        await asyncio.to_thread(batcher.close)

    app = FastAPI(title="trainformer serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    add_error_handlers(app)
    add_health_routes(app, batcher, metrics)
    add_status_routes(app, registry)
    add_predict_routes(app, registry, batcher, metrics, limits)
    return app


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> Response:
        return error(err.status_code, f"{request.method} {request.url.path}: {err.detail}", err.headers)

    @app.exception_handler(ClientError)
    async def client_error(request: Request, err: ClientError) -> Response:
        return error(err.status, str(err), err.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return error(500, "internal error (see the server log)")


def add_health_routes(app: FastAPI, batcher: Batcher, metrics: ServeMetrics) -> None:
    @app.get("/healthz")
    async def healthz() -> Response:
        return error(503, "shutting down") if batcher.closed else json_response({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)


def refuse_verb(requested: str, method: str) -> None:
    """A GET on `NAME:predict` lands in the status routes (a model name may hold no ':'): it is
    the right URL with the wrong method, not a missing model."""
    _, colon, verb = requested.rpartition(":")
    if colon and verb == "predict":
        raise ClientError(f"{method} {requested}: :predict takes POST with a JSON body", status=405,
                          headers={"Allow": "POST"})
    if colon:
        raise ClientError(f"{requested}: unknown verb :{verb} (this server answers :predict)", status=404)


def add_status_routes(app: FastAPI, registry: Registry) -> None:
    @app.get("/v1/models/{requested}")
    @app.get("/v1/models/{requested}/versions/{version}")
    async def status(request: Request, requested: str, version: str | None = None) -> Response:
        refuse_verb(version or requested, request.method)
        versions = registry.find(requested).status(parse_version(version))
        return json_response({"model_version_status": versions})

    @app.get("/v1/models/{requested}/metadata")
    @app.get("/v1/models/{requested}/versions/{version}/metadata")
    async def metadata(requested: str, version: str | None = None) -> Response:
        served = registry.find(requested).acquire(parse_version(version))
        try:
            return json_response(model_metadata(requested, served.model))
        finally:
            served.release()


def model_metadata(name: str, model: ServedModel) -> dict:
    """TF Serving's GetModelMetadata answer as JSON, plus what a client needs from metadata.json."""
    signatures = {key: signature.tf_serving() for key, signature in model.signatures.items()}
    about = {key: model.metadata[key] for key in ("task", "labels", "max_length", "pad_id", "step", "run")
             if key in model.metadata}
    return {"model_spec": {"name": name, "signature_name": "", "version": model.version},
            "metadata": {"signature_def": {"signature_def": signatures}, "trainformer": about}}


def add_predict_routes(app: FastAPI, registry: Registry, batcher: Batcher, metrics: ServeMetrics,
                       limits: Limits) -> None:
    @app.post("/v1/models/{requested}:predict")
    @app.post("/v1/models/{requested}/versions/{version}:predict")
    async def predict(request: Request, requested: str, version: str | None = None) -> Response:
        started = time.perf_counter()
        response = await answer(request, requested, version)
        metrics.request(response.status_code, time.perf_counter() - started, api="rest")
        return response

    async def answer(request: Request, requested: str, version: str | None) -> Response:
        try:
            number = parse_version(version)
            registry.find(requested)  # an unknown model is a 404 before the body is read
            payload = decode_body(await read_body(request, limits.max_body_bytes))
            parsed = []

            def prepare(served):
                parsed.append(parse_predict(payload, served.model.signatures, served.rules))
                return parsed[0].signature_name, parsed[0].inputs

            _, _, future = submit(registry, batcher, requested, number, prepare)
            outputs = await asyncio.wrap_future(future)
            return json_response(predict_response(own_masks(outputs), parsed[0].columnar))
        except ClientError as err:
            return error(err.status, str(err))
        except ModelInputError as err:
            return error(400, str(err))
        except Overloaded as err:
            return error(503, f"overloaded: {err}; retry", headers={"Retry-After": "1"})
        except Closed as err:
            return error(503, str(err))
        except Exception:
            log.exception("predict failed: the model raised")
            return error(500, "the model failed on this request (see the server log)")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to exceed `limit` bytes."""
    too_large = ClientError(f"the request body exceeds {limit} bytes (--max-body-mb)", status=413)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientError("the client went away before sending the whole body") from None
    return b"".join(chunks)
