"""`trainformer serve` end to end: a tiny intent classifier trained and exported for real,
served by the real command in a subprocess on a loopback port, and spoken to over HTTP as a
TF Serving client would: answers equal the SavedModel's own, hostile input never gets a 5xx,
200 concurrent clients get no errors and share model calls, SIGTERM lets requests finish."""

import http.client
import json
import re
import signal
import socket
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  the SavedModel holds its tokenizer ops
from cli_helpers import trainformer
from serve_helpers import Server, highest

TEXTS = ["你好", "今天天气怎么样", "你喜欢什么电影？", "我想吃火锅", "讲个笑话吧", "早上好" * 40]  # the last is truncated


@pytest.fixture(scope="module")
def exported(served_base):
    return served_base  # conftest: a tiny zh-intent run exported to a base path named intent


@pytest.fixture(scope="module")
def server(exported, tmp_path_factory):
    running = Server(exported, "--no-grpc", log_path=tmp_path_factory.mktemp("log") / "serve.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def saved_model(exported):
    return tf.saved_model.load(str(highest(exported)))


def test_status_and_metadata_answer_as_tf_serving(server, exported):
    assert server.name == "run"  # the exported run's name (metadata.json), not the export folder's (intent)
    status = server.client.get(server.model).json()
    step = highest(exported).name  # the version folder's name, as TF Serving's REST API writes it
    assert status == {"model_version_status": [{"version": step, "state": "AVAILABLE",
                                                "status": {"error_code": "OK", "error_message": ""}}]}
    assert server.client.get(f"{server.model}/versions/{step}").status_code == 200
    assert server.client.get(f"{server.model}/versions/999999").status_code == 404
    metadata = server.client.get(f"{server.model}/metadata").json()
    assert metadata["model_spec"] == {"name": "run", "signature_name": "", "version": step}
    signatures = metadata["metadata"]["signature_def"]["signature_def"]
    default = signatures["serving_default"]
    assert default["inputs"]["text"]["dtype"] == "DT_STRING"
    assert default["outputs"]["probabilities"]["dtype"] == "DT_FLOAT"
    assert {"label", "label_ids", "probabilities", "logits", "truncated"} <= set(default["outputs"])
    assert signatures["serve_ids"]["inputs"]["token_ids"]["dtype"] == "DT_INT32"
    assert server.client.get(f"{server.root}/healthz").json() == {"status": "ok"}
    missing = server.client.get(f"{server.root}/v1/models/other")
    assert missing.status_code == 404 and missing.json()["error"] == "Could not find any versions of model other " \
                                                                   "(this server serves run)"
    wrong_method = server.client.get(f"{server.model}:predict")  # the right URL, the wrong method
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert "POST" in wrong_method.json()["error"]


def test_rest_answers_equal_the_saved_models_own(server, saved_model):
    own = {name: value.numpy() for name, value in saved_model.signatures["serving_default"](text=tf.constant(TEXTS)).items()}
    rows = server.predict({"instances": [TEXTS[0], *({"text": text} for text in TEXTS[1:])]})
    assert rows.status_code == 200, rows.text
    predictions = rows.json()["predictions"]
    assert [p["label"] for p in predictions] == [label.decode() for label in own["label"]]
    assert [p["truncated"] for p in predictions] == [False] * 5 + [True]
    np.testing.assert_allclose([p["probabilities"] for p in predictions], own["probabilities"], rtol=1e-5, atol=1e-6)
    columns = server.predict({"inputs": {"text": TEXTS}}).json()["outputs"]
    assert columns["label_ids"] == own["label_ids"].tolist()
    np.testing.assert_allclose(columns["logits"], own["logits"], rtol=1e-5, atol=1e-5)
    assert server.predict({"inputs": TEXTS[:2]}).json()["outputs"]["label_ids"] == own["label_ids"][:2].tolist()

    ids = [[2, 400, 500, 3, 0, 0], [2, 600, 3, 0, 0, 0]]  # [CLS] ... [SEP] [PAD]...
    own_ids = saved_model.signatures["serve_ids"](token_ids=tf.constant(ids, tf.int32))
    answer = server.predict({"signature_name": "serve_ids", "instances": [{"token_ids": row} for row in ids]})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose([p["logits"] for p in answer.json()["predictions"]], own_ids["logits"].numpy(),
                               rtol=1e-5, atol=1e-5)


def fuzz_cases():
    """(what, body bytes, expected status) for hostile or broken requests."""
    def body(text):
        return text.encode("utf-8")

    return [
        ("malformed JSON", b'{"instances": ["a",', 400),
        ("not JSON at all", b"\x00\x01\x02", 400),
        ("non-UTF-8 bytes", b'{"instances": ["\xff\xfe"]}', 400),
        ("a lone surrogate", body('{"instances": ["\\ud800"]}'), 400),
        ("deeply nested", b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400),
        ("nested lists as text", body('{"instances": [[["a"]]]}'), 400),
        ("a JSON array body", body('["a"]'), 400),
        ("a number body", b"7", 400),
        ("empty body", b"", 400),
        ("empty batch", body('{"instances": []}'), 400),
        ("both formats", body('{"instances": ["a"], "inputs": ["a"]}'), 400),
        ("neither format", body('{"signature_name": "serving_default"}'), 400),
        ("unknown top key", body('{"instances": ["a"], "extra": 1}'), 400),
        ("instances not a list", body('{"instances": "a"}'), 400),
        ("a number as text", body('{"instances": [5]}'), 400),
        ("null as text", body('{"instances": [null]}'), 400),
        ("missing input key", body('{"instances": [{"txt": "a"}]}'), 400),
        ("extra input key", body('{"instances": [{"text": "a", "b": 1}]}'), 400),
        ("columnar not a list", body('{"inputs": {"text": "a"}}'), 400),
        ("unknown signature", body('{"signature_name": "nope", "instances": ["a"]}'), 400),
        ("signature name not a string", body('{"signature_name": 3, "instances": ["a"]}'), 400),
        ("ids as text", body('{"signature_name": "serve_ids", "instances": ["a"]}'), 400),
        ("float ids", body('{"signature_name": "serve_ids", "instances": [[2, 3.5, 3]]}'), 400),
        ("bool ids", body('{"signature_name": "serve_ids", "instances": [[2, true, 3]]}'), 400),
        ("ragged ids", body('{"signature_name": "serve_ids", "instances": [[2, 3], [2, 5, 3]]}'), 400),
        ("empty ids", body('{"signature_name": "serve_ids", "instances": [[]]}'), 400),
        ("ids beyond int32", body('{"signature_name": "serve_ids", "instances": [[2, 9999999999, 3]]}'), 400),
        ("ids beyond the vocabulary", body('{"signature_name": "serve_ids", "instances": [[2, 2000000, 3]]}'), 400),
        ("negative ids", body('{"signature_name": "serve_ids", "instances": [[2, -5, 3]]}'), 400),
        ("ids longer than the model", body('{"signature_name": "serve_ids", "instances": [[2' + ", 5" * 600 + "]]}"),
         400),
        ("a 5000-digit number", body('{"instances": [' + "1" * 5000 + "]}"), 400),
        ("10k instances", body('{"instances": [' + ", ".join(['"a"'] * 10_000) + "]}"), 413),
        ("a 5 MiB body", body('{"instances": ["' + "a" * (5 << 20) + '"]}'), 413),
        ("control characters", body('{"instances": ["\\u0000\\u0001\\u001b[31m\\u007f\\u200b\\ufeff", ""]}'), 200),
        ("a long text", body('{"instances": ["' + "天" * 100_000 + '"]}'), 200),
        ("emoji and mixed scripts", body('{"inputs": {"text": ["😀 hello 你好 مرحبا"]}}'), 200),
    ]


@pytest.mark.parametrize("what,content,expected", fuzz_cases(), ids=[case[0] for case in fuzz_cases()])
def test_hostile_input_gets_a_clear_4xx_never_a_5xx(server, what, content, expected):
    answer = server.predict(content=content)
    assert answer.status_code == expected, answer.text
    error = answer.json().get("error")
    assert (error is None) == (expected == 200)
    assert error is None or ("Traceback" not in error and "\n" not in error)


def test_the_server_still_answers_after_the_fuzz(server):
    answer = server.predict({"instances": ["你好"]})
    assert answer.status_code == 200 and len(answer.json()["predictions"]) == 1
    assert server.process.poll() is None
    metrics = server.client.get(f"{server.root}/metrics").text
    assert not re.search(r'trainformer_serve_requests_total\{api="rest",code="5\d\d"\}', metrics)


def load(server, clients, requests_each):
    """`clients` threads, each on its own keep-alive connection sending `requests_each` predicts
    (http.client: httpx's AsyncClient is slower than this server with 200 connections)."""
    host, port = server.root.removeprefix("http://").split(":")
    codes = []

    def one_client(index):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        for i in range(requests_each):
            body = json.dumps({"instances": [TEXTS[(index + i) % 5]]})
            connection.request("POST", f"/v1/models/{server.name}:predict", body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            answer.read()
            codes.append(answer.status)
        connection.close()

    threads = [threading.Thread(target=one_client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)  # bounded: a hung server fails the count below
    return codes


def metric(text, name):
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))


def test_200_concurrent_clients_get_no_errors_and_share_model_calls(server):
    before = server.client.get(f"{server.root}/metrics").text
    started = time.monotonic()
    codes = load(server, clients=200, requests_each=10)
    seconds = time.monotonic() - started
    assert codes == [200] * 2000, f"{len(codes)} answers, {sorted(set(codes))}, after {seconds:.1f}s"
    after = server.client.get(f"{server.root}/metrics").text
    calls = metric(after, "trainformer_serve_batch_size_count") - metric(before, "trainformer_serve_batch_size_count")
    rows = metric(after, "trainformer_serve_batch_size_sum") - metric(before, "trainformer_serve_batch_size_sum")
    answered = (metric(after, 'trainformer_serve_requests_total{api="rest",code="200"}')
                - metric(before, 'trainformer_serve_requests_total{api="rest",code="200"}'))
    assert rows == answered == 2000
    assert calls < 2000 / 4  # dynamic batching merged concurrent requests into shared model calls
    assert metric(after, "trainformer_serve_request_seconds_count") >= 2000


def test_sigterm_lets_requests_in_flight_finish_then_exits_0(exported, tmp_path):
    # a long batch timeout holds the requests inside the server when SIGTERM comes
    server = Server(exported, "--name", "slow", "--batch-timeout-ms", "1000", "--max-batch", "64",
                    log_path=tmp_path / "serve.log")
    codes = []
    # Connected and sent before SIGTERM, whatever the machine's load: a client still starting up
    # when it comes would meet a closed port, which is not what this test is about.
    host, port = server.root.removeprefix("http://").split(":")
    connections = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(8)]
    for connection in connections:
        connection.connect()
    sent = threading.Barrier(len(connections) + 1)

    def ask(connection):
        connection.request("POST", f"/v1/models/{server.name}:predict", json.dumps({"instances": ["你好"]}),
                           {"Content-Type": "application/json"})
        sent.wait()
        codes.append(connection.getresponse().status)

    askers = [threading.Thread(target=ask, args=(connection,)) for connection in connections]
    for asker in askers:
        asker.start()
    sent.wait(timeout=30)
    time.sleep(0.2)  # the server reads them; the 1 s batch timeout keeps them in flight
    server.process.send_signal(signal.SIGTERM)
    for asker in askers:
        asker.join(timeout=30)
    assert codes == [200] * 8
    assert server.process.wait(timeout=30) == 0
    assert server.process.stdout.read() == "stopped serving slow\n"
    server.stop()


def error_line(*args):
    """The one stderr line of `trainformer serve ARGS`, which must exit 2 without printing on stdout."""
    result = trainformer("serve", *map(str, args), check=False)
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr.strip().removeprefix("trainformer: error: ")


def test_a_bad_base_path_or_a_busy_port_is_one_line_and_exit_2(exported, tmp_path):
    assert error_line(tmp_path / "nope") == f"{tmp_path / 'nope'}: no such directory (the base path " \
                                            "trainformer export --out wrote)"
    assert error_line(tmp_path) == f"{tmp_path}: no version folders (BASE/<N>/saved_model.pb, as trainformer " \
                                   "export writes)"
    version = highest(exported)
    assert error_line(version) == f"{version} is a version folder, not a base path: pass its parent, {exported}"
    old = tmp_path / "old"
    (old / "saved_model").mkdir(parents=True)
    (old / "saved_model" / "saved_model.pb").write_bytes(b"")
    assert error_line(old) == f"{old} holds an export in the old layout (saved_model/ at its top): export the run " \
                              "again to a new folder (trainformer export RUN_DIR --out BASE writes BASE/<version>/)"
    assert error_line("--model", "a", exported) == "--model 'a': write it NAME=BASE"
    assert error_line("--model", f"a={exported}", "--model", f"a={exported}") == \
        f"--model 'a={exported}': the name 'a' is given twice"
    assert error_line() == "serve needs a base path: trainformer serve BASE, or --model NAME=BASE"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert error_line(exported, "--port", port).startswith(
            f"cannot listen on 127.0.0.1:{port}: Address already in use")
        assert error_line(exported, "--port", 0, "--grpc-port", port) == \
            f"cannot listen for gRPC on 127.0.0.1:{port}: Address already in use (is another server on it? pick " \
            "another --grpc-port)"
