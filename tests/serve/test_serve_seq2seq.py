"""A seq2seq export served end to end: a tiny English -> Chinese translation run, exported as a
text-in SavedModel (output text, its ids and score, the beam's n-best), served over REST and
gRPC. Both answer what the SavedModel itself answers, string and n-best outputs included, and
a text's answer does not depend on the other texts it was batched with."""

import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  the SavedModel holds its tokenizer ops
from serve_helpers import Server, highest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

SOURCES = ["Click the OK button.", "To Create a Variable", "Select the cells " * 20, "Help", "Insert a new sheet."]


@pytest.fixture(scope="module")
def base(translation_export):
    """conftest's translation export (cli_helpers.TRANSLATION): one version, 20."""
    return translation_export[1]


@pytest.fixture(scope="module")
def server(base, tmp_path_factory):
    running = Server(base, "--name", "translate", log_path=tmp_path_factory.mktemp("log") / "serve.log")
    yield running
    running.stop()


def grpc_predict(server, texts):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "translate"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(texts))
    with grpc.insecure_channel(server.grpc) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 60)
    return {key: tf.make_ndarray(proto) for key, proto in response.outputs.items()}


def as_json(arrays):
    """Arrays as REST writes them: strings decoded, numbers as lists."""
    return {key: (np.vectorize(bytes.decode, otypes=[object])(array) if array.dtype == object else array).tolist()
            for key, array in arrays.items()}


def test_rest_and_grpc_answer_as_the_saved_model_n_best_included(server, base):
    assert server.models["translate"][0] == "seq2seq"
    own = tf.saved_model.load(str(highest(base))).signatures["serving_default"](text=tf.constant(SOURCES))
    own = as_json({key: value.numpy() for key, value in own.items()})
    assert {"output", "output_ids", "score", "outputs", "scores", "truncated"} <= set(own) and any(own["output"])
    rest = server.predict({"inputs": {"text": SOURCES}})
    assert rest.status_code == 200, rest.text
    assert rest.json()["outputs"] == own  # exactly: float32 scores travel as the doubles they are
    assert as_json(grpc_predict(server, SOURCES)) == own
    rows = server.predict({"instances": SOURCES}).json()["predictions"]
    assert [row["outputs"] for row in rows] == own["outputs"]  # each instance its own n-best list
    metadata = server.client.get(f"{server.model}/metadata").json()["metadata"]
    outputs = metadata["signature_def"]["signature_def"]["serving_default"]["outputs"]
    assert outputs["outputs"]["dtype"] == "DT_STRING" and len(outputs["outputs"]["tensor_shape"]["dim"]) == 2


def test_an_answer_does_not_depend_on_who_else_was_batched(server):
    together = server.predict({"instances": SOURCES}).json()["predictions"]

    def alone(text):
        return server.predict({"instances": [text]}).json()["predictions"][0]

    with ThreadPoolExecutor(len(SOURCES)) as pool:  # sent at once: the batcher merges them
        merged = list(pool.map(alone, SOURCES * 3))
    for index, answer in enumerate(merged):
        expected = together[index % len(SOURCES)]
        # The tokens are the same; scores may differ in the last float32 digits, as a batch of
        # another size sums in another order (seen: -32.0618515 vs -32.0618553 under load).
        for key in ("output", "output_ids", "outputs", "truncated"):
            assert answer[key] == expected[key], json.dumps([answer, expected])
        assert answer["score"] == pytest.approx(expected["score"], rel=1e-5)
        assert answer["scores"] == pytest.approx(expected["scores"], rel=1e-5)
