"""Load benchmark for `trainformer serve` (not a test): REST and gRPC requests/s and p50/p99
latency at 1, 16 and 128 concurrent clients, with dynamic batching on (--max-batch 64) and off
(--max-batch 1), all on one machine in one run; then SavedModel vs TFLite single-request
latency. Loopback only; every phase is bounded in requests and seconds.

    .venv/bin/trainformer export RUN_DIR --format saved_model,tflite --out /tmp/intent
    .venv/bin/python benchmarks/serve/load.py /tmp/intent

The REST client is raw HTTP/1.1 on asyncio streams, one keep-alive connection per client:
Python HTTP clients (httpx, http.client) cost more CPU per request than this server does, and
on a small machine they would measure themselves. The gRPC client is TF Serving's own stub on
grpc.aio, requests built once; clients share up to 8 channels (HTTP/2 multiplexes them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TEXTS = ["你好", "今天天气怎么样", "你喜欢什么电影？", "我想吃火锅", "讲个笑话吧", "你是谁", "给我讲讲历史", "股票会涨吗"]


def start_server(base: Path, *options: str) -> tuple[subprocess.Popen, str, int, str]:
    """`trainformer serve BASE` on free ports: (process, model name, REST port, gRPC address)."""
    process = subprocess.Popen([sys.executable, "-m", "trainformer", "serve", str(base), "--port", "0",
                                "--grpc-port", "0", *options], stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    found = re.match(r"serving (\S+) .* on http://127\.0\.0\.1:(\d+)/\S+, gRPC (127\.0\.0\.1:\d+)$", line)
    if not found:
        process.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return process, found.group(1), int(found.group(2)), found.group(3)


def request_bytes(name: str, text: str) -> bytes:
    body = json.dumps({"instances": [text]}, ensure_ascii=False).encode()
    return (f"POST /v1/models/{name}:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def one_client(port: int, requests: list[bytes], deadline: float, latencies: list, errors: list) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for request in requests:
        if time.monotonic() > deadline:
            break
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - started)
        if not head.startswith(b"HTTP/1.1 200"):
            errors.append(head.split(b"\r\n")[0])
    writer.close()


def summary(latencies: list[float], errors: list, elapsed: float) -> dict:
    latencies.sort()
    return {"requests": len(latencies), "errors": len(errors), "req_per_s": len(latencies) / elapsed,
            "p50_ms": 1000 * latencies[len(latencies) // 2], "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)]}


async def run_load(port: int, name: str, clients: int, requests_each: int, seconds: float) -> dict:
    latencies, errors = [], []
    deadline = time.monotonic() + seconds
    started = time.perf_counter()
    await asyncio.gather(*(one_client(port, [request_bytes(name, TEXTS[(c + i) % len(TEXTS)])
                                             for i in range(requests_each)], deadline, latencies, errors)
                           for c in range(clients)))
    return summary(latencies, errors, time.perf_counter() - started)


def grpc_requests(name: str) -> list:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    requests = []
    for text in TEXTS:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        request.inputs["text"].CopyFrom(tf.make_tensor_proto([text]))
        requests.append(request)
    return requests


async def run_grpc_load(address: str, requests: list, clients: int, requests_each: int, seconds: float) -> dict:
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    latencies, errors = [], []
    channels = [grpc.aio.insecure_channel(address) for _ in range(min(clients, 8))]
    stubs = [prediction_service_pb2_grpc.PredictionServiceStub(channel) for channel in channels]
    deadline = time.monotonic() + seconds

    async def one(client: int) -> None:
        stub = stubs[client % len(stubs)]
        for i in range(requests_each):
            if time.monotonic() > deadline:
                break
            began = time.perf_counter()
            try:
                await stub.Predict(requests[(client + i) % len(requests)], timeout=30)
            except grpc.RpcError as err:
                errors.append(err.code())
            latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    await asyncio.gather(*(one(client) for client in range(clients)))
    elapsed = time.perf_counter() - started
    for channel in channels:
        await channel.close()
    return summary(latencies, errors, elapsed)


def batch_counts(port: int) -> tuple[float, float]:
    """(model calls, instances) so far, from the server's /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    value = lambda name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # noqa: E731
    return value("trainformer_serve_batch_size_count"), value("trainformer_serve_batch_size_sum")


def load_table(base: Path, requests_per_client: int, seconds: float) -> list[dict]:
    """Every row: for each batching setting one server, REST then gRPC at 1, 16, 128 clients."""
    rows = []
    for label, options in (("on (--max-batch 64)", ["--max-batch", "64"]), ("off (--max-batch 1)", ["--max-batch", "1"])):
        process, name, port, address = start_server(base, *options)
        requests = grpc_requests(name)
        try:
            asyncio.run(run_load(port, name, 4, 25, seconds))  # warm up
            asyncio.run(run_grpc_load(address, requests, 4, 25, seconds))
            for api in ("REST", "gRPC"):
                for clients in (1, 16, 128):
                    each = max(requests_per_client, 2000 // clients)
                    calls, instances = batch_counts(port)
                    result = asyncio.run(run_load(port, name, clients, each, seconds) if api == "REST" else
                                         run_grpc_load(address, requests, clients, each, seconds))
                    calls_after, instances_after = batch_counts(port)
                    result.update(api=api, batching=label, clients=clients,
                                  mean_batch=(instances_after - instances) / max(calls_after - calls, 1))
                    rows.append(result)
                    print(format_row(result), flush=True)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    return rows


def format_row(row: dict) -> str:
    return (f"| {row['api']} | {row['batching']} | {row['clients']} | {row['req_per_s']:.0f} | {row['p50_ms']:.1f} | "
            f"{row['p99_ms']:.1f} | {row['mean_batch']:.1f} | {row['requests']} | {row['errors']} |")


def single_latency(base: Path, repeats: int) -> list[str]:
    """Median in-process latency of one request: SavedModel text in, SavedModel ids in, TFLite ids in."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    model_dir = max((child for child in base.iterdir() if child.name.isdigit()), key=lambda child: int(child.name))
    metadata = json.loads((model_dir / "metadata.json").read_text())
    loaded = tf.saved_model.load(str(model_dir))
    rng = np.random.default_rng(0)
    ids = np.zeros([1, metadata["max_length"]], np.int32)  # [CLS] 14 ids [SEP], padded: TFLite's fixed shape
    ids[0, :16] = [2, *rng.integers(5, metadata["vocab_size"], 14), 3]
    candidates = {
        "SavedModel, text in (tokenizer included)": lambda: loaded.signatures["serving_default"](text=tf.constant(["今天天气怎么样"])),
        "SavedModel, ids in": lambda: loaded.signatures["serve_ids"](token_ids=tf.constant(ids)),
    }
    tflite = model_dir / "model.tflite"
    if tflite.exists():
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(tflite))
        detail = interpreter.get_input_details()[0]
        if list(detail["shape"]) != list(ids.shape):
            interpreter.resize_tensor_input(detail["index"], ids.shape)
        interpreter.allocate_tensors()

        def call_tflite():
            interpreter.set_tensor(detail["index"], ids)
            interpreter.invoke()
            return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])

        candidates["TFLite, ids in (ai_edge_litert)"] = call_tflite
    lines = []
    for label, call in candidates.items():
        for _ in range(5):
            call()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        lines.append(f"| {label} | {1000 * statistics.median(times):.2f} | {1000 * np.percentile(times, 99):.2f} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="a trainformer export base path (BASE/<version>/, with model.tflite)")
    parser.add_argument("--requests-per-client", type=int, default=50, help="at least this many each (default 50)")
    parser.add_argument("--seconds", type=float, default=20, help="cap per measurement (default 20)")
    parser.add_argument("--repeats", type=int, default=300, help="single-request calls timed (default 300)")
    args = parser.parse_args()
    print("| API | dynamic batching | clients | req/s | p50 ms | p99 ms | mean batch | requests | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    load_table(args.base, args.requests_per_client, args.seconds)
    print("\n| one request, in process | p50 ms | p99 ms |\n|---|---|---|")
    single_latency(args.base, args.repeats)


if __name__ == "__main__":
    main()
