"""The monitoring stack in docker/: Prometheus scrape config and alert rules, the Grafana
dashboard, compose.yaml. The queries are read from those files and run in a real Prometheus
that scrapes a live `trainformer train --metrics-port P` and the model server's real series."""

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from cli_helpers import TINY_NEWS, start
from prometheus_client import start_http_server

from trainformer.errors import UserError
from trainformer.serve.metrics import ServeMetrics
from trainformer.train.prometheus import HOST_VARIABLE, PrometheusExporter

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
PROMETHEUS_CONFIG = DOCKER / "prometheus" / "prometheus.yml"
ALERTS = DOCKER / "prometheus" / "alerts.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "trainformer.json"
GRAFANA_VARIABLES = {"$__rate_interval": "1m"}  # what Grafana puts in before Prometheus sees a query
TRAINING_SERIES = ("trainformer_step", "trainformer_train_loss", "trainformer_tokens_per_second",
                   "trainformer_learning_rate", "trainformer_data_wait_percent", "trainformer_valid_loss")
NOT_ON_THIS_RUN = ("trainformer_gpu_", "trainformer_loss_scale", "trainformer_skipped_steps")  # GPU, fp16


def tool(name: str) -> str:
    """The path of a Prometheus binary: skipped where it is not installed, but CI must have it."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed: CI must install Debian's prometheus package")
        pytest.skip(f"{name} is not installed")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules() -> list[dict]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def dashboard_panels(panels: list[dict]) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    return [inner for panel in panels for inner in [panel, *dashboard_panels(panel.get("panels", []))]]


def panel_queries() -> dict[str, list[str]]:
    """Panel title -> its queries, with Grafana's variables filled in."""
    queries = {}
    for panel in dashboard_panels(json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]):
        exprs = [target["expr"] for target in panel.get("targets", [])]
        for name, value in GRAFANA_VARIABLES.items():
            exprs = [expr.replace(name, value) for expr in exprs]
        assert not any("$" in expr for expr in exprs), f"{panel['title']}: a variable the test does not know"
        if exprs:
            queries[panel["title"]] = exprs
    return queries


def test_compose_wires_the_services_together():
    compose = load_yaml(DOCKER / "compose.yaml")
    services = compose["services"]
    assert set(services) == {"train", "tensorboard", "serve", "prometheus", "grafana"}
    train = services["train"]
    assert (train["build"]["context"], train["build"]["dockerfile"]) == ("..", "docker/Dockerfile")
    assert train["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert train["environment"][HOST_VARIABLE] == "0.0.0.0"  # else Prometheus cannot reach it

    # Each scrape target is a service started with that port.
    for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]:
        for target in job["static_configs"][0]["targets"]:
            host, port = target.split(":")
            command = services[host]["command"]
            option = "--metrics-port" if "--metrics-port" in command else "--port"
            assert command[command.index(option) + 1] == port, job["job_name"]
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]

    # Grafana: the datasource is the prometheus service, the provider reads a mounted folder
    # that holds the dashboard, and every panel names the provisioned datasource.
    provisioning = DOCKER / "grafana" / "provisioning"
    datasource = load_yaml(provisioning / "datasources" / "prometheus.yaml")["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in services["prometheus"]["ports"]
    mounts = dict(volume.split(":")[1::-1] for volume in services["grafana"]["volumes"])  # target -> source
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    provider_path = load_yaml(provisioning / "dashboards" / "trainformer.yaml")["providers"][0]["options"]["path"]
    assert (DOCKER / mounts[provider_path] / DASHBOARD.name).is_file()
    panels = [panel for panel in dashboard_panels(json.loads(DASHBOARD.read_text())["panels"]) if "targets" in panel]
    assert panels and all(panel["datasource"]["uid"] == datasource["uid"] for panel in panels)


def readme_section(words: str) -> str:
    """The README section whose heading holds `words`, up to the next heading of its level or above."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("#") and words in line.lower()), None)
    assert start is not None, f"README has no heading that says {words!r}"
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    end = next((i for i in range(start + 1, len(lines)) if re.match(rf"#{{1,{level}}} ", lines[i])), len(lines))
    return "\n".join(lines[start + 1:end])


def test_readme_names_every_compose_service_and_no_other():
    """The README's compose section is a table whose rows start with a service name in backticks."""
    named = set(re.findall(r"^\| `([\w-]+)`", readme_section("docker compose"), re.M))
    assert named == set(load_yaml(DOCKER / "compose.yaml")["services"])


def test_promtool_accepts_the_config_and_rules():
    promtool = tool("promtool")
    result = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout  # the rule file was checked too


TRAIN = {"job": "trainformer-train", "instance": "train:9400"}
OTHER = {"job": "trainformer-train", "instance": "other:9400"}
SERVE = {"job": "trainformer-serve", "instance": "serve:8501"}
SERVE_OK = {"job": "trainformer-serve", "instance": "ok:8501"}


def series(name: str, labels: dict, values: str, **more) -> dict:
    selector = ", ".join(f'{key}="{value}"' for key, value in {**labels, **more}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def buckets(name: str, labels: dict, per_bucket: dict[str, str]) -> list[dict]:
    return [series(f"{name}_bucket", labels, values, le=le) for le, values in per_bucket.items()]


# alert -> (input series, one sample a minute; {minute: the labels of each alert firing then}).
# Each alert has a case that fires and a moment (or a series) where it must not.
ALERT_CASES = {
    "TrainingDown": ([series("up", TRAIN, "1x5 0x10")], {8: [], 12: [TRAIN]}),
    "TrainingStalled": ([series("trainformer_step", TRAIN, "0+100x20 2000x25")], {30: [], 38: [TRAIN]}),
    "TrainingWentBack": ([series("trainformer_step", TRAIN, "0+100x10 500+100x10")], {9: [], 12: [TRAIN], 20: []}),
    "NonFiniteLoss": ([series("trainformer_train_loss", TRAIN, "5 4 NaN 3"),
                       series("trainformer_valid_loss", OTHER, "5 Inf 4")], {0: [], 1: [OTHER], 2: [TRAIN], 3: []}),
    "LossScaleCollapsed": ([series("trainformer_loss_scale", TRAIN, "32768 1024 1x10"),
                            series("trainformer_loss_scale", OTHER, "2x12")], {4: [], 8: [TRAIN]}),
    "ThroughputHalved": ([series("trainformer_tokens_per_second", TRAIN, "30000x30 10000x15"),
                          series("trainformer_examples_per_second", OTHER, "100x30 60x15")], {35: [], 41: [TRAIN]}),
    "TrainingDataWaitHigh": ([series("trainformer_data_wait_percent", TRAIN, "5x10 30x15"),
                              series("trainformer_data_wait_percent", OTHER, "19x25")], {15: [], 21: [TRAIN]}),
    "TrainingGpuHot": ([series("trainformer_gpu_temperature_celsius", TRAIN, "80x5 90x10", gpu="0"),
                        series("trainformer_gpu_temperature_celsius", TRAIN, "85x15", gpu="1")],
                       {8: [], 11: [{**TRAIN, "gpu": "0"}]}),
    "TrainingGpuMemoryFull": ([series("trainformer_gpu_memory_used_bytes", TRAIN, "96x20", gpu="0"),
                               series("trainformer_gpu_memory_used_bytes", TRAIN, "90x20", gpu="1"),
                               series("trainformer_gpu_memory_total_bytes", TRAIN, "100x20", gpu="0"),
                               series("trainformer_gpu_memory_total_bytes", TRAIN, "100x20", gpu="1")],
                              {5: [], 11: [{**TRAIN, "gpu": "0"}]}),
    "ServingDown": ([series("up", SERVE, "1x3 0x5")], {5: [], 7: [SERVE]}),
    "ServingErrors": ([series("trainformer_serve_requests_total", SERVE, "0+100x20", code="200"),
                       series("trainformer_serve_requests_total", SERVE, "0+10x20", code="503"),
                       series("trainformer_serve_requests_total", SERVE_OK, "0+100x20", code="200"),
                       # 4xx are the client's fault: 3 errors in 153 stay under 5% (53 would not)
                       series("trainformer_serve_requests_total", SERVE_OK, "0+50x20", code="404"),
                       series("trainformer_serve_requests_total", SERVE_OK, "0+3x20", code="500")],
                      {3: [], 8: [SERVE]}),
    "ServingSlow": ([*buckets("trainformer_serve_request_seconds", SERVE,
                              {"0.1": "0+90x20", "1": "0+97x20", "5": "0+100x20", "+Inf": "0+100x20"}),
                     *buckets("trainformer_serve_request_seconds", SERVE_OK,
                              {"0.1": "0+90x20", "1": "0+100x20", "5": "0+100x20", "+Inf": "0+100x20"})],
                    {5: [], 13: [SERVE]}),
}


def test_each_alert_fires_when_it_should_and_only_then(tmp_path):
    """`promtool test rules` on the real expressions, `for` durations and labels. Annotations are
    left out of the copy it reads: promtool would compare their expanded text too."""
    promtool = tool("promtool")
    rules = load_yaml(ALERTS)
    severity = {}
    for rule in (rule for group in rules["groups"] for rule in group["rules"]):
        rule.pop("annotations")
        severity[rule["alert"]] = rule["labels"]["severity"]
    assert set(ALERT_CASES) == set(severity), "every alert needs a case here"
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    tests = [{"interval": "1m", "input_series": input_series,
              "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert,
                                   "exp_alerts": [{"exp_labels": {**labels, "severity": severity[alert]}}
                                                  for labels in firing]}
                                  for minute, firing in moments.items()]}
             for alert, (input_series, moments) in ALERT_CASES.items()]
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": tests}))
    result = subprocess.run([promtool, "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_metrics_host_comes_from_the_environment(monkeypatch):
    """TRAINFORMER_METRICS_HOST moves the exporter off 127.0.0.1 (127.0.0.2 is loopback too)."""
    monkeypatch.setenv(HOST_VARIABLE, "127.0.0.2")
    port = free_port()
    exporter = PrometheusExporter(port)
    try:
        exporter.update("train", step=7, metrics={"loss": 5.0})
        with urllib.request.urlopen(exporter.url, timeout=5) as response:
            assert "trainformer_step 7.0" in response.read().decode()
        assert exporter.url == f"http://127.0.0.2:{port}/metrics"
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    finally:
        exporter.close()
    monkeypatch.setenv(HOST_VARIABLE, "192.0.2.1")  # TEST-NET-1: no address of this machine
    with pytest.raises(UserError, match=rf"cannot serve on 192\.0\.2\.1:{port} \(.*\${HOST_VARIABLE}\)"):
        PrometheusExporter(port)


class Prometheus:
    """A real Prometheus on a free loopback port, queried through its HTTP API."""

    def __init__(self, binary: str, config: Path, folder: Path):
        self.port = free_port()
        with (folder / "prometheus.log").open("w") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as err:  # a query Prometheus rejects: its JSON says why
            return json.load(err)
        except OSError:
            return {"status": "not answering yet"}

    def query(self, expr: str) -> list[dict]:
        answer = self.get("query", query=expr)
        assert answer["status"] == "success", f"{expr}: {answer}"
        return answer["data"]["result"]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def scrape_config(folder: Path, targets: dict[str, str]) -> Path:
    """docker/prometheus/prometheus.yml with 1 s intervals and its targets on loopback."""
    config = load_yaml(PROMETHEUS_CONFIG)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def serve_metrics(port: int):
    """The model server's own series (trainformer.serve.metrics) after a few requests, on port."""
    metrics = ServeMetrics()
    for code, seconds, rows in ((200, 0.004, 3), (200, 0.02, 8), (503, 0.001, 1)):
        metrics.request(code, seconds)
        metrics.batch(rows)
    server, _ = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    return server


def start_training(folder: Path, metrics_port: int, vocab_args: list[str]) -> subprocess.Popen:
    """A tiny run that would take minutes: the test stops it (SIGTERM) once it has what it needs.
    The session's vocabulary: the series do not depend on it, and training one costs ~5 s."""
    with (folder / "train.log").open("w") as log:
        return start("train", "--run-dir", str(folder / "run"), *TINY_NEWS, *vocab_args, "--set", "train.steps=20000",
                     "--set", "train.eval_every=100", "--set", "train.checkpoint_every=20000",
                     "--metrics-port", str(metrics_port), stdout=log)


def wait_for(ready, what: str, training: subprocess.Popen, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert training.poll() is None, "training ended early"
        if ready():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what} never happened")


def duration_seconds(text: str) -> int:
    """'5m' -> 300: a rule's `for` as /api/v1/rules reports it."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def test_prometheus_scrapes_training_and_every_panel_and_alert_query_evaluates(tmp_path, vocab_args):
    binary = tool("prometheus")
    train_port, serve_port = free_port(), free_port()
    serve_server = serve_metrics(serve_port)
    prometheus = Prometheus(binary, scrape_config(tmp_path, {"trainformer-train": f"127.0.0.1:{train_port}",
                                                            "trainformer-serve": f"127.0.0.1:{serve_port}"}),
                            tmp_path)
    training = start_training(tmp_path, train_port, vocab_args)
    try:
        # A few scrapes of a run past its first eval; the rules were evaluated every second meanwhile.
        enough = "count_over_time(trainformer_step[1m]) >= 3 and on() trainformer_valid_loss"
        wait_for(lambda: prometheus.get("query", query=enough).get("data", {}).get("result"),
                 "three scrapes of a run past its first eval", training)

        for name in TRAINING_SERIES:
            [sample] = prometheus.query(name)
            assert sample["metric"]["job"] == "trainformer-train" and math.isfinite(float(sample["value"][1])), name
        codes = {sample["metric"]["code"] for sample in prometheus.query("trainformer_serve_requests_total")}
        assert codes == {"200", "503"}

        for title, exprs in panel_queries().items():  # each evaluates; a panel shows data unless GPU/fp16
            results = [prometheus.query(expr) for expr in exprs]
            if not any(name in expr for expr in exprs for name in NOT_ON_THIS_RUN):
                assert any(results), f"panel {title!r} has no data"
        for rule in alert_rules():
            prometheus.query(rule["expr"])

        # The rules Prometheus runs are those of alerts.yml, and each one evaluated without error.
        loaded = prometheus.get("rules")["data"]["groups"]
        assert {group["file"] for group in loaded} == {str(ALERTS)}
        assert sorted((group["name"], rule["name"], rule["duration"], rule["labels"], rule["annotations"])
                      for group in loaded for rule in group["rules"]) == sorted(
            (group["name"], rule["alert"], duration_seconds(rule.get("for", "0s")), rule["labels"],
             rule["annotations"]) for group in load_yaml(ALERTS)["groups"] for rule in group["rules"])
        assert all(rule["health"] == "ok" for group in loaded for rule in group["rules"]), loaded
    finally:
        training.send_signal(signal.SIGTERM)  # saves a checkpoint and exits 0
        prometheus.close()
        serve_server.shutdown()
        serve_server.server_close()
        try:
            training.wait(timeout=60)
        except subprocess.TimeoutExpired:
            training.kill()
            raise
    assert training.returncode == 0
