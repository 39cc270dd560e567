"""The server's Prometheus series (GET /metrics). The names are public: Grafana panels and
alert rules are written against them."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServeMetrics:
    """Predict requests by status code, their latency, and the row count of each model call.

    Example:
        metrics = ServeMetrics()
        metrics.request(200, seconds=0.004, api="grpc")
        metrics.batch(12)
        body, content_type = metrics.exposition()
    """

    def __init__(self):
        self.registry = CollectorRegistry()  # not the global one: two servers in one process stay apart
        # gRPC requests count under the HTTP code TF Serving maps their status to (NOT_FOUND: 404),
        # so one 5xx alert covers both APIs; `api` tells them apart
        self.requests = Counter("trainformer_serve_requests", "predict requests by API and HTTP status code",
                                ["api", "code"], registry=self.registry)
        self.latency = Histogram("trainformer_serve_request_seconds", "predict request latency in the server, "
                                 "from routing to the response", buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("trainformer_serve_batch_size", "instances per model call (dynamic batching "
                                    "merges concurrent requests)", buckets=BATCH_BUCKETS, registry=self.registry)

    def request(self, code: int, seconds: float, api: str = "rest") -> None:
        self.requests.labels(api=api, code=str(code)).inc()
        self.latency.observe(seconds)

    def batch(self, rows: int) -> None:
        self.batch_size.observe(rows)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
