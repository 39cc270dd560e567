"""`trainformer serve` over gRPC, spoken to with TF Serving's official client exactly as its docs
show (tensorflow-serving-api's stubs, `tf.make_tensor_proto`): REST and gRPC give the same
answers to the same inputs, bad requests get TF Serving's status codes and never crash the
server, and gRPC requests share the REST path's batcher and metrics."""

import re

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serve_helpers import Server, highest
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

TEXTS = ["你好", "今天天气怎么样", "你喜欢什么电影？", "我想吃火锅", "讲个笑话吧", "早上好" * 40]


@pytest.fixture(scope="module")
def server(served_base, tmp_path_factory):
    running = Server(served_base, "--max-instances", "64", "--max-body-mb", "1",
                     log_path=tmp_path_factory.mktemp("log") / "serve.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc) as opened:
        yield opened


@pytest.fixture(scope="module")
def stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def predict_request(name, inputs, signature_name="serving_default", version=None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature_name
    if version is not None:
        request.model_spec.version.value = version
    for key, value in inputs.items():  # a value, or a TensorProto made already
        request.inputs[key].CopyFrom(value if hasattr(value, "tensor_shape") else tf.make_tensor_proto(value))
    return request


def as_arrays(response):
    return {key: tf.make_ndarray(proto) for key, proto in response.outputs.items()}


def test_grpc_and_rest_give_the_same_answers(server, stub):
    response = stub.Predict(predict_request(server.name, {"text": TEXTS}), 30)
    assert response.model_spec.name == server.name and response.model_spec.signature_name == "serving_default"
    assert response.model_spec.version.value == server.models[server.name][1]
    grpc_out = as_arrays(response)
    rest_out = server.predict({"inputs": {"text": TEXTS}}).json()["outputs"]
    assert set(grpc_out) == set(rest_out) >= {"label", "label_ids", "probabilities", "logits", "truncated"}
    assert [label.decode() for label in grpc_out["label"]] == rest_out["label"]
    for key in ("label_ids", "probabilities", "logits", "truncated"):
        # exactly: JSON carries float32 values as the doubles they are
        np.testing.assert_array_equal(grpc_out[key], np.array(rest_out[key], dtype=grpc_out[key].dtype), key)

    ids = np.array([[2, 400, 500, 3, 0, 0], [2, 600, 3, 0, 0, 0]], np.int32)
    by_ids = as_arrays(stub.Predict(predict_request(server.name, {"token_ids": ids}, "serve_ids"), 30))
    rest_ids = server.predict({"signature_name": "serve_ids", "inputs": {"token_ids": ids.tolist()}}).json()["outputs"]
    np.testing.assert_array_equal(by_ids["logits"], np.array(rest_ids["logits"], np.float32))


def test_a_version_is_reached_by_number_and_status_and_metadata_answer(server, stub, channel, served_base):
    number = int(highest(served_base).name)
    response = stub.Predict(predict_request(server.name, {"text": TEXTS[:1]}, version=number), 30)
    assert response.model_spec.version.value == number
    only = predict_request(server.name, {"text": TEXTS[:1]})
    only.output_filter.append("label")
    assert list(stub.Predict(only, 30).outputs) == ["label"]

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = server.name
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, 30)
    [version] = status.model_version_status
    assert version.version == number and version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert version.status.error_code == 0 and version.status.error_message == ""

    metadata_request = get_model_metadata_pb2.GetModelMetadataRequest()
    metadata_request.model_spec.name = server.name
    metadata_request.metadata_field.append("signature_def")
    metadata = stub.GetModelMetadata(metadata_request, 30)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    metadata.metadata["signature_def"].Unpack(signatures)
    default = signatures.signature_def["serving_default"]
    assert default.inputs["text"].dtype == tf.string.as_datatype_enum
    assert default.outputs["probabilities"].dtype == tf.float32.as_datatype_enum
    assert signatures.signature_def["serve_ids"].inputs["token_ids"].dtype == tf.int32.as_datatype_enum
    assert metadata.model_spec.version.value == number


def bad_requests(name):
    """(what, request, expected status code) for requests TF Serving refuses."""
    code = grpc.StatusCode
    label = predict_request(name, {"text": ["你好"]})
    label.model_spec.version_label = "stable"
    return [
        ("unknown model", predict_request("nope", {"text": ["你好"]}), code.NOT_FOUND),
        ("unknown version", predict_request(name, {"text": ["你好"]}, version=999999), code.NOT_FOUND),
        ("a version label", label, code.INVALID_ARGUMENT),
        ("unknown signature", predict_request(name, {"text": ["你好"]}, "nope"), code.INVALID_ARGUMENT),
        ("wrong input name", predict_request(name, {"txt": ["你好"]}), code.INVALID_ARGUMENT),
        ("an extra input", predict_request(name, {"text": ["a"], "b": ["b"]}), code.INVALID_ARGUMENT),
        ("numbers as text", predict_request(name, {"text": np.array([1.5], np.float32)}), code.INVALID_ARGUMENT),
        ("text of rank 2", predict_request(name, {"text": [["a", "b"]]}), code.INVALID_ARGUMENT),
        ("a scalar text", predict_request(name, {"text": "a"}), code.INVALID_ARGUMENT),
        ("no instances", predict_request(name, {"text": tf.make_tensor_proto([], tf.string)}), code.INVALID_ARGUMENT),
        ("int64 ids", predict_request(name, {"token_ids": np.array([[2, 3]], np.int64)}, "serve_ids"),
         code.INVALID_ARGUMENT),
        ("ids beyond the vocabulary", predict_request(name, {"token_ids": np.array([[2, 2_000_000, 3]], np.int32)},
                                                      "serve_ids"), code.INVALID_ARGUMENT),
        ("ids of rank 1", predict_request(name, {"token_ids": np.array([2, 3], np.int32)}, "serve_ids"),
         code.INVALID_ARGUMENT),
        ("more instances than --max-instances", predict_request(name, {"text": ["a"] * 65}), code.RESOURCE_EXHAUSTED),
        ("a message over --max-body-mb", predict_request(name, {"text": ["a" * (2 << 20)]}), code.RESOURCE_EXHAUSTED),
    ]


@pytest.mark.parametrize("what", [case[0] for case in bad_requests("x")])
def test_bad_requests_get_tf_serving_status_codes(server, stub, what):
    _, request, expected = next(case for case in bad_requests(server.name) if case[0] == what)
    with pytest.raises(grpc.RpcError) as raised:
        stub.Predict(request, 30)
    assert raised.value.code() == expected, raised.value.details()
    assert "\n" not in raised.value.details() and "Traceback" not in raised.value.details()


def test_unknown_models_in_status_and_metadata_are_not_found(server, stub, channel):
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as raised:
        model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, 30)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    metadata_request = get_model_metadata_pb2.GetModelMetadataRequest()
    metadata_request.model_spec.name = server.name
    metadata_request.metadata_field.append("nothing")
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetModelMetadata(metadata_request, 30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def metric(text, name):
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_grpc_requests_share_the_batcher_and_the_metrics(server, stub):
    before = server.client.get(f"{server.root}/metrics").text
    pending = [stub.Predict.future(predict_request(server.name, {"text": [TEXTS[i % 5]]}), 60) for i in range(100)]
    answers = [future.result() for future in pending]
    assert all(len(tf.make_ndarray(answer.outputs["label"])) == 1 for answer in answers)
    after = server.client.get(f"{server.root}/metrics").text
    delta = {name: metric(after, name) - metric(before, name) for name in (
        "trainformer_serve_batch_size_count", "trainformer_serve_batch_size_sum",
        'trainformer_serve_requests_total{api="grpc",code="200"}')}
    assert delta['trainformer_serve_requests_total{api="grpc",code="200"}'] == 100
    assert delta["trainformer_serve_batch_size_sum"] == 100
    assert delta["trainformer_serve_batch_size_count"] < 100 / 2  # concurrent requests shared model calls
    assert metric(after, 'trainformer_serve_requests_total{api="grpc",code="404"}') >= 1  # the bad ones counted
    assert not re.search(r'trainformer_serve_requests_total\{api="grpc",code="5\d\d"\}', after)
    assert server.process.poll() is None
