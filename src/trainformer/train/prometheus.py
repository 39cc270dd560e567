"""Prometheus metrics for a running job (`trainformer train --metrics-port P`).

Served on 127.0.0.1 unless TRAINFORMER_METRICS_HOST names another address: the metrics are
unauthenticated, so a job opens them to other machines only when asked to (in a container,
where Prometheus runs in another container, docker/compose.yaml sets it to 0.0.0.0).
Training gauges are set by the Monitor as it logs, each created when it first gets a value
(a valid loss of 0 before the first eval would read as a perfect model); GPU gauges (utilisation,
memory used and total, temperature) are read through NVML at scrape time when NVIDIA GPUs are
present: without them, or without the NVIDIA driver, there are simply no GPU series.
docker/prometheus/alerts.yml and the Grafana dashboard use these names: keep them in step.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily

from trainformer.errors import UserError

TRAIN_GAUGES = {  # metric key in the Monitor -> (Prometheus name, help)
    "loss": ("trainformer_train_loss", "mean training loss over the last logging interval"),
    "masked_accuracy": ("trainformer_train_masked_accuracy", "masked-token accuracy over the last interval"),
    "accuracy": ("trainformer_train_accuracy", "classification accuracy over the last interval"),
    "tokens_per_s": ("trainformer_tokens_per_second", "training throughput over the last interval"),
    "examples_per_s": ("trainformer_examples_per_second", "training throughput over the last interval"),
    "data_wait_pct": ("trainformer_data_wait_percent", "share of step time spent waiting for input"),
    "learning_rate": ("trainformer_learning_rate", "learning rate of the next step"),
    "grad_norm": ("trainformer_grad_norm", "mean global gradient norm (before clipping)"),
    "loss_scale": ("trainformer_loss_scale", "fp16 dynamic loss scale"),
    "skipped_steps": ("trainformer_skipped_steps", "fp16 steps skipped for non-finite gradients"),
}
VALID_GAUGES = {
    "loss": ("trainformer_valid_loss", "held-out loss"),
    "masked_accuracy": ("trainformer_valid_masked_accuracy", "held-out cloze masked-token accuracy"),
    "accuracy": ("trainformer_valid_accuracy", "held-out classification accuracy"),
    "macro_f1": ("trainformer_valid_macro_f1", "held-out classification macro-F1"),
}
HOST_VARIABLE = "TRAINFORMER_METRICS_HOST"  # the address to serve on; default 127.0.0.1


class NvmlCollector:
    """GPU utilisation, memory (used and total) and temperature per device, read at scrape time."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.count = pynvml.nvmlDeviceGetCount()
        except Exception:  # no driver, no library, no GPU: not an error for a CPU job
            self.nvml, self.count = None, 0

    def collect(self):
        if not self.count:
            return
        utilisation = GaugeMetricFamily("trainformer_gpu_utilization_percent", "GPU busy time", labels=["gpu"])
        memory = GaugeMetricFamily("trainformer_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"])
        total = GaugeMetricFamily("trainformer_gpu_memory_total_bytes", "GPU memory installed", labels=["gpu"])
        temperature = GaugeMetricFamily("trainformer_gpu_temperature_celsius", "GPU temperature", labels=["gpu"])
        for index in range(self.count):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            utilisation.add_metric([str(index)], self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory_info = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            memory.add_metric([str(index)], memory_info.used)
            total.add_metric([str(index)], memory_info.total)
            temperature.add_metric(
                [str(index)], self.nvml.nvmlDeviceGetTemperature(handle, self.nvml.NVML_TEMPERATURE_GPU)
            )
        yield from (utilisation, memory, total, temperature)


class PrometheusExporter:
    """Serves /metrics on port until close(), on 127.0.0.1 or $TRAINFORMER_METRICS_HOST.

    Example:
        exporter = PrometheusExporter(9400)
        exporter.update("train", step=100, metrics={"loss": 5.1, "tokens_per_s": 24000.0})
    """

    def __init__(self, port: int):
        self.registry = CollectorRegistry()
        self.host = os.environ.get(HOST_VARIABLE) or "127.0.0.1"
        self.port = port
        self.gauges: dict[tuple[str, str], Gauge] = {}
        self.registry.register(NvmlCollector())
        try:
            self._server, self._thread = start_http_server(port, addr=self.host, registry=self.registry)
        except OSError as err:  # a busy port, or a host that is no address of this machine
            origin = f"; the host is ${HOST_VARIABLE}" if os.environ.get(HOST_VARIABLE) else ""
            raise UserError(
                f"--metrics-port {port}: cannot serve on {self.host}:{port} ({err.strerror}{origin})"
            ) from None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def update(self, split: str, step: int, metrics: dict) -> None:
        if split == "train":
            self._set(split, "step", ("trainformer_step", "optimizer steps completed"), step)
        table = TRAIN_GAUGES if split == "train" else VALID_GAUGES
        for key, value in metrics.items():
            if key in table:
                self._set(split, key, table[key], value)

    def _set(self, split: str, key: str, name_and_help: tuple[str, str], value: float) -> None:
        if (split, key) not in self.gauges:
            self.gauges[split, key] = Gauge(*name_and_help, registry=self.registry)
        self.gauges[split, key].set(value)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
