"""What every task's serving module shares: a run's model and tokenizer as in-graph functions.

A task's module (ClassifyServing, FillMaskServing, Seq2SeqServing) defines three tf.functions
and one method:

    encode(text)   texts -> (the ids signature's inputs, truncated), as training encodes
    ids(...)       the ids-in answer: the SavedModel's serve_ids, the TFLite and ONNX models
    text(text)     the text-in answer: the SavedModel's serving_default
    answer(texts)  what `trainformer predict` prints, one dict per text

`trainformer predict` calls them and `trainformer export` saves them, so a served model
answers exactly what predict printed.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from trainformer.data.tokenizer import Tokenizer

TEXT = tf.TensorSpec([None], tf.string, name="text")  # the text-in input: a batch of strings


class TaskServing(tf.Module):
    """The model, the tokenizer and data.seq_len (texts are cut to it, as in training)."""

    def __init__(self, model: keras.Model, tokenizer: Tokenizer, seq_len: int, name: str):
        super().__init__(name=name)
        self.model = model
        self.tokenizer = tokenizer
        self.seq_len = seq_len

    def exported_functions(self) -> dict:
        """SavedModel signature name -> function (not an attribute: `signatures` is reserved)."""
        return {"serving_default": self.text, "serve_ids": self.ids}
