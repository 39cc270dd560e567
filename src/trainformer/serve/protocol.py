"""TF Serving's REST predict protocol: JSON request body -> input arrays, outputs -> JSON.

Row format: {"instances": [instance, ...]}, each instance a value of the signature's one input
(a text) or an object naming every input ({"text": ...}); the answer is {"predictions": [...]},
one object per instance holding every output. Columnar format: {"inputs": value or
{name: [...]}} -> {"outputs": {name: [...]}}. Either may name a "signature_name".
Every problem with a request is a ClientError carrying its HTTP status and one clear line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from trainformer.serve.model import Signature, TensorInfo

DEFAULT_SIGNATURE = "serving_default"


class ClientError(Exception):
    """A request we cannot answer, by the client's doing: `status` 400, 404, 413..."""

    def __init__(self, message: str, status: int = 400, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers  # e.g. a 405's Allow


@dataclass(frozen=True)
class Rules:
    """What a request may hold. Token ids are checked here, not left to the model: out of
    range, a CPU gather fails but a GPU one silently reads zeros."""

    max_instances: int = 1024
    pad_id: int = 0
    vocab_size: int | None = None  # every token id below it
    max_length: int | None = None  # token_ids rows at most this long ([CLS] and [SEP] included)


@dataclass
class PredictRequest:
    signature_name: str
    inputs: dict[str, np.ndarray]  # name -> (rows, ...)
    columnar: bool

    @property
    def rows(self) -> int:
        return len(next(iter(self.inputs.values())))


def decode_body(body: bytes):
    """The JSON value of a request body; non-UTF-8, malformed or too deeply nested is a ClientError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ClientError(f"the request body is not UTF-8 (byte {err.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ClientError("the request body is JSON nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, and ints longer than Python converts
        raise ClientError(f"the request body is not valid JSON: {err}") from None


def parse_predict(payload, signatures: dict[str, Signature], rules: Rules = Rules()) -> PredictRequest:
    """A decoded request body -> the signature to call and its input arrays, checked against
    the signature's inputs (names, dtypes, ranks) and the instance limit."""
    if not isinstance(payload, dict):
        raise ClientError('the request body must be a JSON object with "instances" (row format) '
                          'or "inputs" (columnar format)')
    unknown = sorted(set(payload) - {"signature_name", "instances", "inputs"})
    if unknown:
        raise ClientError(f"unknown key {unknown[0]!r} in the request: expected \"instances\" or \"inputs\", "
                          f"and optionally \"signature_name\"")
    if ("instances" in payload) == ("inputs" in payload):
        raise ClientError('the request must have exactly one of "instances" (row format) or "inputs" '
                          '(columnar format)')
    name = payload.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str) or name not in signatures:
        raise ClientError(f"Serving signature name: {json.dumps(name)} not found in signature def "
                          f"(this model has: {', '.join(sorted(signatures))})")
    signature = signatures[name]
    if "instances" in payload:
        columns = row_columns(payload["instances"], signature)
    else:
        columns = named_columns(payload["inputs"], signature)
    count = len(next(iter(columns.values())))
    if count == 0:
        raise ClientError("no instances: send at least one")
    if count > rules.max_instances:
        raise ClientError(f"too many instances: {count} (this server answers at most {rules.max_instances} "
                          f"per request: split it)", status=413)
    inputs = {key: to_array(values, signature.inputs[key], key, rules.pad_id) for key, values in columns.items()}
    if "token_ids" in inputs:
        check_token_ids(inputs["token_ids"], rules)
    return PredictRequest(name, inputs, columnar="inputs" in payload)


def row_columns(instances, signature: Signature) -> dict[str, list]:
    """{"instances": [...]} -> {input name: [value per instance]}."""
    if not isinstance(instances, list):
        raise ClientError(f'"instances" must be a list, not {json_type(instances)}')
    names = list(signature.inputs)
    columns: dict[str, list] = {name: [] for name in names}
    for index, instance in enumerate(instances):
        if isinstance(instance, dict):
            check_names(instance, names, f"instance {index}")
            for name in names:
                columns[name].append(instance[name])
        elif len(names) == 1:
            columns[names[0]].append(instance)
        else:
            raise ClientError(f"instance {index} must be an object with the inputs {', '.join(names)}")
    return columns


def named_columns(inputs, signature: Signature) -> dict[str, list]:
    """{"inputs": ...} -> {input name: [value per instance]}."""
    names = list(signature.inputs)
    if isinstance(inputs, dict):
        check_names(inputs, names, '"inputs"')
        columns = {name: inputs[name] for name in names}
    elif len(names) == 1:
        columns = {names[0]: inputs}
    else:
        raise ClientError(f'"inputs" must be an object with the inputs {", ".join(names)}')
    for name, values in columns.items():
        if not isinstance(values, list):
            raise ClientError(f'input "{name}" must be a list (one value per instance), not {json_type(values)}')
    counts = {len(values) for values in columns.values()}
    if len(counts) > 1:
        raise ClientError(f"the inputs {', '.join(names)} have different numbers of instances")
    return columns


def check_names(given: dict, names: list[str], where: str) -> None:
    missing = [name for name in names if name not in given]
    if missing:
        raise ClientError(f'{where} lacks the input "{missing[0]}" (this signature takes {", ".join(names)})')
    extra = sorted(set(given) - set(names))
    if extra:
        raise ClientError(f'{where} has an unknown input "{extra[0]}" (this signature takes {", ".join(names)})')


def to_array(values: list, info: TensorInfo, name: str, pad_id: int) -> np.ndarray:
    """One input's values (one per instance) -> an array of the signature's dtype and rank."""
    if info.is_text and len(info.shape) == 1:
        return np.array([text_bytes(value, index, name) for index, value in enumerate(values)], dtype=object)
    if info.dtype.kind == "i" and len(info.shape) == 2:
        return id_rows(values, info, name, pad_id)
    raise ClientError(f'input "{name}" ({info.tf_serving()["dtype"]}, rank {len(info.shape)}) '
                      "cannot be given over JSON by this server")


def text_bytes(value, index: int, name: str) -> bytes:
    if not isinstance(value, str):
        raise ClientError(f'instance {index}: input "{name}" must be a string, not {json_type(value)}')
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # JSON can spell a lone surrogate (\ud800); UTF-8 cannot
        raise ClientError(f'instance {index}: input "{name}" is not valid Unicode (a lone surrogate)') from None


def id_rows(values: list, info: TensorInfo, name: str, pad_id: int) -> np.ndarray:
    """Lists of ints -> (rows, width); each row as long as the first (pad them with pad_id)."""
    limits = np.iinfo(info.dtype)
    width = None
    for index, row in enumerate(values):
        if not isinstance(row, list) or not all(type(value) is int for value in row):
            raise ClientError(f'instance {index}: input "{name}" must be a list of integers')
        if width is None:
            width = len(row)
        if len(row) != width or not row:
            raise ClientError(f'instance {index}: input "{name}" has {len(row)} values, instance 0 has {width}: '
                              f"send rows of one length, at least 1, padded with {pad_id}")
        if min(row) < limits.min or max(row) > limits.max:
            raise ClientError(f'instance {index}: input "{name}" holds a value outside {info.dtype.name}')
    return np.array(values, dtype=info.dtype)


def check_token_ids(ids: np.ndarray, rules: Rules) -> None:
    """ids (rows, width): within the vocabulary, and no longer than the model's positions."""
    if rules.max_length is not None and ids.shape[1] > rules.max_length:
        raise ClientError(f'input "token_ids" has rows of {ids.shape[1]} ids: this model takes at most '
                          f"{rules.max_length}")
    outside = ids < 0
    if rules.vocab_size is not None:
        outside |= ids >= rules.vocab_size
    if outside.any():
        vocabulary = f"0 to {rules.vocab_size - 1}" if rules.vocab_size is not None else "no negative ids"
        raise ClientError(f'instance {int(np.argwhere(outside)[0][0])}: input "token_ids" holds an id outside '
                          f"the vocabulary ({vocabulary})")


def json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def predict_response(outputs: dict[str, np.ndarray], columnar: bool) -> dict:
    """Output arrays (rows, ...) -> TF Serving's answer: {"predictions": [one object per
    instance]} for row format, {"outputs": {name: [...]}} for columnar."""
    columns = {name: json_values(array) for name, array in outputs.items()}
    if columnar:
        return {"outputs": columns}
    return {"predictions": [dict(zip(columns, row)) for row in zip(*columns.values())]}


def own_masks(outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A fill-mask answer merged with other requests is padded to the batch's most [MASK]s: cut
    it back to this request's own, so an answer never depends on who else asked at the time."""
    if "mask_count" not in outputs:
        return outputs
    width = int(outputs["mask_count"].max(initial=0))
    return {name: array[:, :width] if name in ("tokens", "scores") else array for name, array in outputs.items()}


def json_values(array: np.ndarray) -> list:
    """An array as nested lists, strings decoded (tf.string outputs come as bytes)."""
    if array.dtype == object:
        array = np.vectorize(lambda value: value.decode("utf-8", "replace"), otypes=[object])(array)
    return array.tolist()
