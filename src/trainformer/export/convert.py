"""A task's ids-in function (`serving.ids`) as TFLite and ONNX files.

Both take token ids, not text: TFLite's interpreter cannot run tensorflow-text's ops, and ONNX
has none. The export's tokenizer.py gives them the ids the in-graph tokenizer would.
"""

from __future__ import annotations

import logging
from pathlib import Path

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from trainformer.errors import UserError

QUANTIZATIONS = ("dynamic", "float16")
ONNX_OPSET = 17


def frozen_ids(serving: tf.Module) -> tf.Module:
    """serving.ids with its weights folded into constants, as a module whose `serve_ids` keeps
    the input names and the output dict.

    Why: a TFLite model converted with resource variables holds them uninitialised in LiteRT's
    interpreter (measured with ai-edge-litert 2.3: READ_VARIABLE fails, or NaN logits under
    XNNPACK). Freezing flattens the output dict (in key order), so it is rebuilt here.
    """
    concrete = serving.ids.get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)
    names = sorted(concrete.structured_outputs)  # tf.nest's order for a dict

    module = tf.Module()
    module.serve_ids = tf.function(lambda *inputs: dict(zip(names, frozen(*inputs))),
                                   input_signature=serving.ids.input_signature, autograph=False)
    return module


def to_tflite(serving: tf.Module, path: Path, quantization: str | None = None) -> None:
    """Write the ids-in TFLite model: float32, or with dynamic-range (int8 weights) or float16
    weight quantization."""
    module = frozen_ids(serving)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.serve_ids.get_concrete_function()], module)
    if quantization:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantization == "float16":
        converter.target_spec.supported_types = [tf.float16]
    try:
        path.write_bytes(converter.convert())
    except Exception as err:  # the converter raises its own error types, with pages of MLIR
        raise UserError(f"tflite: this model cannot be converted ({_first_line(err)})") from None


def to_onnx(serving: tf.Module, path: Path) -> None:
    """Write the ids-in ONNX model (tf2onnx, opset ONNX_OPSET)."""
    import tf2onnx

    tf2onnx.logging.set_level(logging.ERROR)  # its INFO lines describe every rewrite
    try:
        tf2onnx.convert.from_function(serving.ids, input_signature=serving.ids.input_signature, opset=ONNX_OPSET,
                                      output_path=str(path))
    except Exception as err:  # e.g. an op tf2onnx has no converter for
        raise UserError(f"onnx: this model cannot be converted ({_first_line(err)})") from None


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"
