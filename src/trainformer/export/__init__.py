"""`trainformer export`: a run's model as artifacts that answer without trainformer.

    export_run(run_dir, base)   # BASE/<step>/: the SavedModel (text in), model.tflite, model.onnx, metadata.json

exporter.py writes them, versions.py keeps BASE in TF Serving's layout (numbered version folders,
each appearing whole), convert.py turns the task's ids-in function into TFLite and ONNX,
parity.py checks every artifact against the Keras model, and wordpiece_tokenizer.py (copied
into each version as tokenizer.py) gives the TFLite and ONNX models their ids without TensorFlow.
"""

from trainformer.export.exporter import FORMATS, export_run

__all__ = ["FORMATS", "export_run"]
