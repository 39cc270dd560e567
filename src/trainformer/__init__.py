"""trainformer: from raw text to a trained Transformer on TensorFlow."""

__version__ = "0.1.0"
