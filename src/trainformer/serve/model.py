"""One version of an exported model (`trainformer export`) loaded for serving.

A version folder BASE/<N>/ is a SavedModel as TF Serving loads it (saved_model.pb,
variables/, assets/) with metadata.json beside it; the graph holds the tensorflow-text
tokenizer ops, so `tensorflow_text` is imported before loading it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainformer.errors import UserError
from trainformer.files import read_json


class ModelInputError(Exception):
    """The model refused an input TensorFlow calls invalid (TF Serving answers 400 with it)."""


TF_DTYPES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF"}  # the rest: DT_ + numpy name


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a signature: numpy dtype and shape (None where it varies)."""

    dtype: np.dtype
    shape: tuple[int | None, ...]

    @property
    def is_text(self) -> bool:
        return self.dtype == np.dtype(object)

    def tf_serving(self) -> dict:
        """TF Serving's TensorInfo JSON: {"dtype": "DT_STRING", "tensor_shape": {"dim": [...]}}."""
        name = "DT_STRING" if self.is_text else TF_DTYPES.get(self.dtype.name, f"DT_{self.dtype.name.upper()}")
        dims = [{"size": str(-1 if size is None else size), "name": ""} for size in self.shape]
        return {"dtype": name, "tensor_shape": {"dim": dims, "unknown_rank": False}}


class Signature:
    """A SavedModel signature called with numpy arrays: inputs (rows, ...) -> outputs (rows, ...)."""

    def __init__(self, function):
        self.function = function
        _, specs = function.structured_input_signature
        self.inputs = {name: tensor_info(spec) for name, spec in sorted(specs.items())}
        self.outputs = {name: tensor_info(spec) for name, spec in sorted(function.structured_outputs.items())}

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        try:
            outputs = self.function(**inputs)
        except tf.errors.InvalidArgumentError as err:
            raise ModelInputError(first_line(err)) from err
        return {name: outputs[name].numpy() for name in self.outputs}

    def tf_serving(self) -> dict:
        """TF Serving's SignatureDef JSON."""
        return {"inputs": {name: info.tf_serving() for name, info in self.inputs.items()},
                "outputs": {name: info.tf_serving() for name, info in self.outputs.items()},
                "method_name": "tensorflow/serving/predict"}


class ServedModel:
    """The signatures and metadata of one version folder. `load` checks the folder first, so a
    wrong path is one clear line (UserError) before TensorFlow starts."""

    def __init__(self, model_dir: Path, metadata: dict, loaded):
        self.model_dir = model_dir
        self.metadata = metadata
        self.loaded = loaded  # the signatures' variables and tables live as long as this object
        self.signatures = {name: Signature(function) for name, function in loaded.signatures.items()}

    @property
    def task(self) -> str:
        return str(self.metadata.get("task", "unknown"))

    @property
    def version(self) -> str:
        """TF Serving's model version: the version folder's name (BASE/<N>/)."""
        return self.model_dir.name

    @property
    def pad_id(self) -> int:
        return int(self.metadata.get("pad_id", 0))

    @staticmethod
    def load(model_dir: Path) -> "ServedModel":
        metadata = read_metadata(model_dir)
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers the tokenizer ops the graph holds

        try:
            loaded = tf.saved_model.load(str(model_dir))
        except Exception as err:  # a damaged or foreign SavedModel: which error varies by damage
            raise UserError(f"{model_dir}: cannot load the SavedModel: {first_line(err)}") from err
        if "serving_default" not in loaded.signatures:
            raise UserError(f"{model_dir} has no serving_default signature: is it a trainformer export?")
        return ServedModel(model_dir, metadata, loaded)


def read_metadata(model_dir: Path) -> dict:
    """BASE/<N>/metadata.json, after checking the version folder holds a SavedModel."""
    if not (model_dir / "saved_model.pb").is_file():
        raise UserError(f"{model_dir}: no saved_model.pb (a version folder written by trainformer export)")
    path = model_dir / "metadata.json"
    if not path.is_file():
        raise UserError(f"{path}: missing (trainformer export writes it beside saved_model.pb)")
    return read_json(path)


def tensor_info(spec) -> TensorInfo:
    dtype = np.dtype(object) if spec.dtype.name == "string" else np.dtype(spec.dtype.as_numpy_dtype)
    return TensorInfo(dtype, tuple(spec.shape.as_list()) if spec.shape.rank is not None else ())


def first_line(err: BaseException) -> str:
    """The line of a (TensorFlow) error message meant for people. A graph error wraps it in a
    header, the op's Python stack and node markers, which say nothing to a client."""
    message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", getattr(err, "message", None) or str(err))
    for line in message.splitlines():
        if line.strip() and not line[0].isspace() and not line.startswith(NOISE):
            return line.strip()
    return type(err).__name__


NOISE = ("Graph execution error:", "Detected at node", "<stack traces unavailable>", "[[")
