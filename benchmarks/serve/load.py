"""Load benchmark for `trainformer serve` (not a test): requests/s and p50/p99 latency at 1, 16
and 128 concurrent clients, with dynamic batching on (--max-batch 64) and off (--max-batch 1),
then SavedModel vs TFLite single-request latency. Loopback only; every phase is bounded in
requests and seconds.

    .venv/bin/trainformer export RUN_DIR --format saved_model,tflite --out /tmp/intent
    .venv/bin/python benchmarks/serve/load.py /tmp/intent

The load client is raw HTTP/1.1 on asyncio streams, one keep-alive connection per client:
Python HTTP clients (httpx, http.client) cost more CPU per request than this server does, and
on a small machine they would measure themselves.
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


def start_server(model_dir: Path, *options: str) -> tuple[subprocess.Popen, str, int]:
    process = subprocess.Popen([sys.executable, "-m", "trainformer", "serve", str(model_dir), "--port", "0", *options],
                               stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    found = re.match(r"serving (\S+) .* on http://127\.0\.0\.1:(\d+)/", line)
    if not found:
        process.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return process, found.group(1), int(found.group(2))


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


async def run_load(port: int, name: str, clients: int, requests_each: int, seconds: float) -> dict:
    latencies, errors = [], []
    deadline = time.monotonic() + seconds
    started = time.perf_counter()
    await asyncio.gather(*(one_client(port, [request_bytes(name, TEXTS[(c + i) % len(TEXTS)])
                                             for i in range(requests_each)], deadline, latencies, errors)
                           for c in range(clients)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {"requests": len(latencies), "errors": len(errors), "req_per_s": len(latencies) / elapsed,
            "p50_ms": 1000 * latencies[len(latencies) // 2], "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)]}


def batch_counts(port: int) -> tuple[float, float]:
    """(model calls, instances) so far, from the server's /metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    value = lambda name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # noqa: E731
    return value("trainformer_serve_batch_size_count"), value("trainformer_serve_batch_size_sum")


def rest_table(model_dir: Path, requests_per_client: int, seconds: float) -> list[dict]:
    rows = []
    for label, options in (("on (--max-batch 64)", ["--max-batch", "64"]), ("off (--max-batch 1)", ["--max-batch", "1"])):
        process, name, port = start_server(model_dir, *options)
        try:
            asyncio.run(run_load(port, name, 4, 25, seconds))  # warm up
            for clients in (1, 16, 128):
                calls, instances = batch_counts(port)
                result = asyncio.run(run_load(port, name, clients, max(requests_per_client, 2000 // clients), seconds))
                calls_after, instances_after = batch_counts(port)
                result.update(batching=label, clients=clients,
                              mean_batch=(instances_after - instances) / max(calls_after - calls, 1))
                rows.append(result)
                print(format_rest(result), flush=True)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    return rows


def format_rest(row: dict) -> str:
    return (f"| {row['batching']} | {row['clients']} | {row['req_per_s']:.0f} | {row['p50_ms']:.1f} | "
            f"{row['p99_ms']:.1f} | {row['mean_batch']:.1f} | {row['requests']} | {row['errors']} |")


def single_latency(model_dir: Path, repeats: int) -> list[str]:
    """Median in-process latency of one request: SavedModel text in, SavedModel ids in, TFLite ids in."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    metadata = json.loads((model_dir / "metadata.json").read_text())
    loaded = tf.saved_model.load(str(model_dir / "saved_model"))
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
    parser.add_argument("model_dir", type=Path, help="a trainformer export folder (saved_model/, model.tflite)")
    parser.add_argument("--requests-per-client", type=int, default=50, help="at least this many each (default 50)")
    parser.add_argument("--seconds", type=float, default=20, help="cap per measurement (default 20)")
    parser.add_argument("--repeats", type=int, default=300, help="single-request calls timed (default 300)")
    args = parser.parse_args()
    print("| dynamic batching | clients | req/s | p50 ms | p99 ms | mean batch | requests | errors |")
    print("|---|---|---|---|---|---|---|---|")
    rest_table(args.model_dir, args.requests_per_client, args.seconds)
    print("\n| one request, in process | p50 ms | p99 ms |\n|---|---|---|")
    single_latency(args.model_dir, args.repeats)


if __name__ == "__main__":
    main()
