"""The app in-process, on a small real SavedModel whose signatures fail on purpose: a model
that breaks is a 500 that says only that (the traceback goes to the log), and an input
TensorFlow calls invalid is a 400 with TensorFlow's first line, as TF Serving answers."""

import json
import logging

import numpy as np
import pytest
import tensorflow as tf
from fastapi.testclient import TestClient

from trainformer.serve.app import create_app
from trainformer.serve.batching import Batcher
from trainformer.serve.metrics import ServeMetrics
from trainformer.serve.model import ServedModel
from trainformer.serve.protocol import own_masks
from trainformer.serve.versions import AVAILABLE, ModelVersions, Registry, Version


class FileReader(tf.Module):
    """serving_default: the size of the file each text names (a missing file fails inside the
    model); parse: each text as a number (not a number: TensorFlow's InvalidArgumentError)."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def sizes(self, text):
        return {"size": tf.map_fn(lambda path: tf.strings.length(tf.io.read_file(path)), text,
                                  fn_output_signature=tf.int32)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def parse(self, text):
        return {"number": tf.strings.to_number(text)}


def registry_of(name, base, number):
    """A Registry serving BASE/NUMBER as NAME, loaded without the warm-up (a text naming no
    file fails this model on purpose)."""
    version = Version(number, base / str(number))
    version.model, version.state = ServedModel.load(version.folder), AVAILABLE
    versions = ModelVersions(name, base, 1024)
    versions.versions[number] = versions.latest = version
    return Registry({name: versions})


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reader")
    module = FileReader()
    tf.saved_model.save(module, str(folder / "7"), signatures={"serving_default": module.sizes, "parse": module.parse})
    (folder / "7" / "metadata.json").write_text(json.dumps({"task": "classify", "step": 7}))
    metrics = ServeMetrics()
    batcher = Batcher(lambda signature, inputs: signature(inputs), on_batch=metrics.batch)
    with TestClient(create_app(registry_of("reader", folder, 7), batcher, metrics)) as running:
        yield running, folder


def test_a_model_failure_is_a_500_without_a_traceback_and_a_log_line(client, caplog):
    running, folder = client
    ok = running.post("/v1/models/reader:predict", json={"instances": [str(folder / "7" / "metadata.json")]})
    assert ok.status_code == 200 and ok.json() == {"predictions": [{"size": len((folder / "7" / "metadata.json").read_bytes())}]}
    with caplog.at_level(logging.ERROR, logger="trainformer.serve"):
        broken = running.post("/v1/models/reader:predict", json={"instances": [str(folder / "missing")]})
    assert broken.status_code == 500
    assert broken.json() == {"error": "the model failed on this request (see the server log)"}
    assert "NotFoundError" in caplog.text and "Traceback" in caplog.text  # the log has the whole story
    assert running.get("/healthz").status_code == 200
    metrics = running.get("/metrics").text
    assert 'trainformer_serve_requests_total{api="rest",code="500"} 1.0' in metrics


def test_an_input_tensorflow_rejects_is_a_400_with_its_first_line(client):
    running, _ = client
    answer = running.post("/v1/models/reader:predict", json={"signature_name": "parse", "inputs": ["1.5", "abc"]})
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("StringToNumberOp could not correctly convert string: abc")
    assert "\n" not in answer.json()["error"]
    good = running.post("/v1/models/reader:predict", json={"signature_name": "parse", "inputs": ["1.5", "2"]})
    assert good.json() == {"outputs": {"number": [1.5, 2.0]}}


def test_a_fill_mask_answer_merged_with_wider_requests_is_cut_to_its_own_masks():
    # Rows of a merged call split back to one request: its texts have 1 and 0 [MASK]s, while
    # another request in the same call had 3, so the model padded the masks axis to 3.
    merged = {"tokens": np.array([[["的"] * 5, [""] * 5, [""] * 5], [[""] * 5] * 3], object),
              "scores": np.zeros([2, 3, 5], np.float32), "mask_count": np.array([1, 0], np.int32),
              "truncated": np.array([False, False])}
    own = own_masks(merged)
    assert own["tokens"].shape == (2, 1, 5) and own["scores"].shape == (2, 1, 5)
    assert own["mask_count"].tolist() == [1, 0] and own["tokens"][0, 0, 0] == "的"
    classify = {"label": np.array([b"pos"]), "probabilities": np.ones([1, 2], np.float32)}
    assert own_masks(classify) is classify


def test_a_wrong_method_is_a_405_not_a_missing_model(client):
    running, _ = client
    for url in ("/v1/models/reader:predict", "/v1/models/reader/versions/7:predict"):
        answer = running.get(url)
        assert answer.status_code == 405, url
        assert answer.headers["allow"] == "POST" and ":predict takes POST" in answer.json()["error"]
    posted = running.post("/v1/models/reader")  # status is GET only
    assert posted.status_code == 405 and posted.json()["error"].startswith("POST /v1/models/reader: ")
    unknown = running.post("/v1/models/reader:classify", json={"instances": ["x"]})
    assert unknown.status_code in (404, 405)  # never a 5xx
    assert running.get("/v1/models/reader:classify").status_code == 404


def test_the_default_name_is_the_exported_runs(tmp_path):
    from trainformer.serve.server import default_name

    export = tmp_path / "zh-bert-tiny" / "export"
    export.mkdir(parents=True)
    assert default_name(export, {"run": "zh-bert-tiny", "run_dir": ".."}) == "zh-bert-tiny"
    assert default_name(export, {}) == "export"  # an export made before metadata named its run
    assert default_name(export, {"run": "runs with spaces"}) == "export"  # not a name a URL can hold
    odd = tmp_path / "my export"
    odd.mkdir()
    assert default_name(odd, {}) == "model"
