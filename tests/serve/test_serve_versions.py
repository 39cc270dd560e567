"""Versions as TF Serving manages them: a new version folder appearing under a base path is
loaded while the server runs and takes over without failing a request in flight, over REST
and gRPC; the old one is unloaded (END); a broken one is reported and the old keeps serving;
several models are served side by side."""

import shutil
import threading
import time

import grpc
import pytest
import tensorflow as tf
from serve_helpers import Server, highest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


@pytest.fixture(scope="module")
def bases(served_base, tmp_path_factory):
    """Two base paths with version 1 each, free to add versions to."""
    root = tmp_path_factory.mktemp("bases")
    for name in ("intent", "other"):
        shutil.copytree(highest(served_base), root / name / "1")
    return root / "intent", root / "other"


@pytest.fixture(scope="module")
def server(bases, tmp_path_factory):
    intent, other = bases
    running = Server("--model", f"intent={intent}", "--model", f"other={other}", "--poll-seconds", "0.3",
                     log_path=tmp_path_factory.mktemp("log") / "serve.log", models=2)
    yield running
    running.stop()


def add_version(base, number, source):
    """A version folder appearing at once, as export writes it: staged under a non-numeric name."""
    staging = base / f".{number}.partial"
    shutil.copytree(source, staging)
    staging.rename(base / str(number))


def states(server, name):
    answer = server.client.get(f"{server.root}/v1/models/{name}").json()
    return {int(entry["version"]): entry["state"] for entry in answer["model_version_status"]}


def wait_for(server, name, expected, seconds=90):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if states(server, name) == expected:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name}: {states(server, name)}, expected {expected}; log: {open(server.log_path).read()}")


class Traffic:
    """REST and gRPC predicts sent back to back from their own threads until stopped."""

    def __init__(self, server):
        self.server, self.codes, self.versions = server, [], set()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.rest), threading.Thread(target=self.grpc)]
        for thread in self.threads:
            thread.start()

    def rest(self):
        model = f"{self.server.root}/v1/models/intent"
        while not self.stopping.is_set():
            self.codes.append(self.server.predict({"instances": ["你好"]}, model=model).status_code)

    def grpc(self):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "intent"
        request.inputs["text"].CopyFrom(tf.make_tensor_proto(["你好"]))
        with grpc.insecure_channel(self.server.grpc) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not self.stopping.is_set():
                try:
                    self.versions.add(stub.Predict(request, 30).model_spec.version.value)
                    self.codes.append(200)
                except grpc.RpcError as err:
                    self.codes.append(str(err.code()))

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)
        return self.codes


def test_a_new_version_takes_over_without_failing_a_request(server, bases):
    intent, _ = bases
    assert states(server, "intent") == {1: "AVAILABLE"}
    traffic = Traffic(server)
    time.sleep(1)  # requests flowing before the new version appears
    (intent / "notes").mkdir()  # neither a staging folder nor anything non-numeric is a version
    add_version(intent, 2, intent / "1")
    wait_for(server, "intent", {2: "AVAILABLE", 1: "END"})
    time.sleep(1)  # and flowing after
    codes = traffic.stop()
    assert codes and set(codes) == {200}, {code: codes.count(code) for code in set(codes)}
    assert traffic.versions == {1, 2}  # answered by both, in turn
    assert states(server, "other") == {1: "AVAILABLE"}  # the other model is untouched


def test_versions_are_reached_by_number_while_loaded(server):
    model = f"{server.root}/v1/models/intent"
    assert server.predict({"instances": ["你好"]}, model=f"{model}/versions/2").status_code == 200
    gone = server.predict({"instances": ["你好"]}, model=f"{model}/versions/1")
    assert gone.status_code == 404
    assert gone.json() == {"error": "Servable not found for request: Specific(intent, 1)"}
    assert server.client.get(f"{model}/versions/1/metadata").status_code == 404
    assert server.client.get(f"{model}/versions/2/metadata").json()["model_spec"]["version"] == "2"
    assert server.client.get(f"{model}/versions/1").json() == {"model_version_status": [
        {"version": "1", "state": "END", "status": {"error_code": "OK", "error_message": ""}}]}
    missing = server.client.get(f"{model}/versions/7")
    assert missing.status_code == 404 and missing.json() == {"error": "Could not find version 7 of model intent"}
    assert server.client.get(f"{model}/versions/x").status_code == 404


def test_a_broken_version_is_reported_and_the_old_one_keeps_serving(server, bases):
    intent, _ = bases
    staging = intent / ".3.partial"
    staging.mkdir()
    (staging / "saved_model.pb").write_bytes(b"not a SavedModel")
    (staging / "metadata.json").write_text('{"task": "classify"}')
    staging.rename(intent / "3")
    deadline = time.monotonic() + 60
    while states(server, "intent").get(3) != "END" and time.monotonic() < deadline:
        time.sleep(0.2)
    status = server.client.get(f"{server.root}/v1/models/intent/versions/3").json()["model_version_status"][0]
    assert status["state"] == "END" and status["status"]["error_code"] == "UNKNOWN"
    assert "cannot load the SavedModel" in status["status"]["error_message"]
    assert states(server, "intent") == {3: "END", 2: "AVAILABLE", 1: "END"}
    answer = server.predict({"instances": ["你好"]}, model=f"{server.root}/v1/models/intent")
    assert answer.status_code == 200


def test_removing_the_served_versions_folder_goes_back_to_the_highest_left(server, bases):
    intent, _ = bases
    shutil.rmtree(intent / "3")
    shutil.rmtree(intent / "2")
    wait_for(server, "intent", {3: "END", 2: "END", 1: "AVAILABLE"})
    answer = server.predict({"instances": ["你好"]}, model=f"{server.root}/v1/models/intent/versions/1")
    assert answer.status_code == 200
