"""TF Serving's gRPC API, from the protos of the `tensorflow-serving-api` package:
PredictionService.Predict and GetModelMetadata, ModelService.GetModelStatus. Requests share the
REST path's batcher, limits and metrics; a bad one gets the gRPC status code TF Serving gives
(INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, UNAVAILABLE), never a crash."""

from __future__ import annotations

import logging
import time
from concurrent import futures

import grpc
import numpy as np
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

from trainformer.errors import UserError
from trainformer.serve.batching import Batcher, Closed, Overloaded
from trainformer.serve.metrics import ServeMetrics
from trainformer.serve.model import ModelInputError, Signature
from trainformer.serve.protocol import DEFAULT_SIGNATURE, ClientError, Rules, check_token_ids, own_masks
from trainformer.serve.versions import Registry, Version, submit

log = logging.getLogger("trainformer.serve")

CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED}
HTTP = {grpc.StatusCode.OK: 200, grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
        grpc.StatusCode.RESOURCE_EXHAUSTED: 413, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.INTERNAL: 500}
STATES = {"LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}  # ModelVersionStatus.State
WORKERS = 256  # each request waiting on the batcher holds one: enough for batches to fill


class Refused(Exception):
    """A request answered with a gRPC status code and one line."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def model_version(spec) -> int | None:
    if spec.WhichOneof("version_choice") == "version_label":
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "version labels are not supported: give a version number")
    return spec.version.value if spec.HasField("version") else None


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, registry: Registry, batcher: Batcher, metrics: ServeMetrics, max_instances: int):
        self.registry, self.batcher, self.metrics, self.max_instances = registry, batcher, metrics, max_instances

    def Predict(self, request, context):
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return self.predict(request)
        except Exception as err:
            code, message = status_of(err)
            context.abort(code, message)  # raises: the metric below still counts it
        finally:
            self.metrics.request(HTTP.get(code, 500), time.perf_counter() - started, api="grpc")

    def predict(self, request) -> predict_pb2.PredictResponse:
        name = request.model_spec.name
        signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        number = model_version(request.model_spec)

        def prepare(version: Version):
            signature = find_signature(version, signature_name)
            return signature_name, to_inputs(request.inputs, signature, version.rules, self.max_instances)

        version, _, future = submit(self.registry, self.batcher, name, number, prepare)
        outputs = own_masks(future.result())
        wanted = list(request.output_filter) or list(outputs)
        unknown = [key for key in wanted if key not in outputs]
        if unknown:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"output_filter names {unknown[0]!r}, not an output of "
                                                            f"{signature_name} ({', '.join(outputs)})")
        response = predict_pb2.PredictResponse()
        response.model_spec.name = name
        response.model_spec.version.value = version.number
        response.model_spec.signature_name = signature_name
        for key in wanted:
            response.outputs[key].CopyFrom(tensor_proto(outputs[key]))
        return response

    def GetModelMetadata(self, request, context):
        try:
            return self.metadata(request)
        except Exception as err:
            context.abort(*status_of(err))

    def metadata(self, request) -> get_model_metadata_pb2.GetModelMetadataResponse:
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"metadata_field must be [\"signature_def\"], not {fields}")
        version = self.registry.find(request.model_spec.name).acquire(model_version(request.model_spec))
        try:
            signatures = get_model_metadata_pb2.SignatureDefMap()
            for key, signature in version.model.signatures.items():
                signatures.signature_def[key].CopyFrom(signature_def(signature))
        finally:
            version.release()
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = version.number
        response.metadata["signature_def"].Pack(signatures)
        return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, registry: Registry):
        self.registry = registry

    def GetModelStatus(self, request, context):
        try:
            versions = self.registry.find(request.model_spec.name).status(model_version(request.model_spec))
        except Exception as err:
            context.abort(*status_of(err))
        response = get_model_status_pb2.GetModelStatusResponse()
        for status in versions:
            entry = response.model_version_status.add()
            entry.version = int(status["version"])
            entry.state = STATES[status["state"]]
            entry.status.error_code = 0 if status["status"]["error_code"] == "OK" else 2  # tensorflow.error.UNKNOWN
            entry.status.error_message = status["status"]["error_message"]
        return response


def status_of(err: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status for what went wrong, as the REST path's HTTP status for the same."""
    if isinstance(err, Refused):
        return err.code, str(err)
    if isinstance(err, ClientError):
        return CODES.get(err.status, grpc.StatusCode.INVALID_ARGUMENT), str(err)
    if isinstance(err, ModelInputError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(err)
    if isinstance(err, Overloaded):
        return grpc.StatusCode.UNAVAILABLE, f"overloaded: {err}; retry"
    if isinstance(err, Closed):
        return grpc.StatusCode.UNAVAILABLE, str(err)
    log.error("gRPC request failed: the model raised", exc_info=err)
    return grpc.StatusCode.INTERNAL, "the model failed on this request (see the server log)"


def find_signature(version: Version, name: str) -> Signature:
    signatures = version.model.signatures
    if name not in signatures:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"Serving signature name: \"{name}\" not found in signature "
                                                        f"def (this model has: {', '.join(sorted(signatures))})")
    return signatures[name]


def to_inputs(protos, signature: Signature, rules: Rules, max_instances: int) -> dict[str, np.ndarray]:
    """The request's TensorProtos as arrays, checked against the signature: names, dtypes,
    ranks, one batch size, the instance limit and (ids) the vocabulary."""
    import tensorflow as tf

    names = sorted(signature.inputs)
    if sorted(protos) != names:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"inputs {sorted(protos)} given: this signature takes "
                                                        f"{', '.join(names)}")
    arrays = {}
    for key in names:
        try:
            arrays[key] = tf.make_ndarray(protos[key])
        except Exception as err:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"input {key!r} is not a valid tensor: {err}") from None
        check_array(key, arrays[key], signature.inputs[key])
    rows = {len(array) for array in arrays.values()}
    if len(rows) > 1:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"the inputs {', '.join(names)} have different batch sizes")
    count = rows.pop()
    if count == 0:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "no instances: send at least one")
    if count > max_instances:
        raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many instances: {count} (this server answers at "
                                                          f"most {max_instances} per request: split it)")
    if "token_ids" in arrays:
        check_token_ids(arrays["token_ids"], rules)
    return arrays


def check_array(key: str, array: np.ndarray, info) -> None:
    want = "string" if info.is_text else info.dtype.name
    got = "string" if array.dtype == object else array.dtype.name
    if want != got:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"input {key!r} must be {want}, not {got}")
    if array.ndim != len(info.shape) or any(size is not None and size != actual
                                            for size, actual in zip(info.shape, array.shape)):
        expected = [-1 if size is None else size for size in info.shape]
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"input {key!r} has shape {list(array.shape)}: this "
                                                        f"signature takes {expected} (-1: any)")


def tensor_proto(array: np.ndarray):
    import tensorflow as tf

    return tf.make_tensor_proto(array)


def signature_def(signature: Signature):
    """Our signature as TF Serving's SignatureDef proto."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    proto = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    for side, infos in ((proto.inputs, signature.inputs), (proto.outputs, signature.outputs)):
        for key, info in infos.items():
            side[key].name = key
            side[key].dtype = tf.string.as_datatype_enum if info.is_text else tf.as_dtype(info.dtype).as_datatype_enum
            for size in info.shape:
                side[key].tensor_shape.dim.add(size=-1 if size is None else size)
    return proto


def start(registry: Registry, batcher: Batcher, metrics: ServeMetrics, address: str, max_instances: int,
          max_body_bytes: int) -> tuple[grpc.Server, int]:
    """A started gRPC server on `address` (host:port, port 0: any free); (server, bound port).
    A message over the body limit is refused by gRPC itself, with RESOURCE_EXHAUSTED."""
    server = grpc.server(futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="grpc"),
                         options=[("grpc.max_receive_message_length", max_body_bytes),
                                  ("grpc.so_reuseport", 0)])  # a busy port is an error, not shared
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(registry, batcher, metrics, max_instances), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(registry), server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise UserError(f"cannot listen for gRPC on {address} (is another server on it? pick another --grpc-port, "
                        "or --no-grpc)")
    server.start()
    return server, port
