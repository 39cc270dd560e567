"""Task heads on top of the encoder."""

from __future__ import annotations

import keras
from keras import ops

from trainformer.config import ModelConfig
from trainformer.model.encoder import TransformerEncoder
from trainformer.model.layers import PACKAGE, ReversibleEmbedding, activation_function


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskedLMHead(keras.layers.Layer):
    """Predicts the original tokens at masked positions, with output weights tied to the
    token embedding.

    Only the masked positions are gathered before the vocabulary projection: at 15% masking
    that is ~7x less head compute than scoring every position.

    Args:
        token_embedding: the encoder's ReversibleEmbedding (its matrix is the output layer).
        epsilon: LayerNorm epsilon.
        activation: the transform's GELU, "gelu_tanh" or "gelu" (exact); the encoder's.

    Call: (sequence (batch, seq, d), masked_positions (batch, P) int32) -> logits (batch, P, vocab)
    float32.
    """

    def __init__(self, token_embedding: ReversibleEmbedding, epsilon: float = 1e-12, activation: str = "gelu_tanh",
                 **kwargs):
        super().__init__(**kwargs)
        activation_function(activation)  # a bad name fails here, not at build
        self.token_embedding = token_embedding
        self.epsilon = epsilon
        self.activation = activation

    def build(self, sequence_shape, masked_positions_shape=None):
        d_model = sequence_shape[-1]
        self._transform = keras.layers.Dense(d_model, activation=activation_function(self.activation), name="transform",
                                             dtype=self.dtype_policy)
        self._transform.build((None, None, d_model))
        self._norm = keras.layers.LayerNormalization(epsilon=self.epsilon, name="norm", dtype=self.dtype_policy)
        self._norm.build((None, None, d_model))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.token_embedding.input_dim,), initializer="zeros"
        )

    def call(self, sequence, masked_positions):
        # expand_dims, not [..., None]: TFLite has no StridedSlice with new axes
        gathered = ops.take_along_axis(sequence, ops.expand_dims(ops.cast(masked_positions, "int32"), -1), axis=1)
        hidden = self._norm(self._transform(gathered))  # (batch, P, d)
        return self.token_embedding(hidden, reverse=True) + ops.cast(self.output_bias, "float32")

    def compute_output_shape(self, sequence_shape, masked_positions_shape):
        return (*masked_positions_shape, self.token_embedding.input_dim)

    def get_config(self):
        # The tied embedding is rebuilt by the model that owns it, not serialised twice.
        return {**super().get_config(), "epsilon": self.epsilon, "activation": self.activation}


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskedLM(keras.Model):
    """Encoder + tied masked-LM head, for pretraining.

    Inputs: token_ids, padding_mask (batch, seq) and masked_positions (batch, P) int32.
    Output: (batch, P, vocab) float32 logits.
    """

    def __init__(self, encoder: TransformerEncoder, **kwargs):
        inputs = {
            "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input((None,), dtype="bool", name="padding_mask"),
            "masked_positions": keras.Input((None,), dtype="int32", name="masked_positions"),
        }
        sequence = encoder({"token_ids": inputs["token_ids"], "padding_mask": inputs["padding_mask"]})
        head = MaskedLMHead(encoder.token_embedding, activation=encoder.activation, name="mlm_head",
                            dtype=encoder.dtype_policy)
        logits = head(sequence, inputs["masked_positions"])
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.encoder = encoder

    def get_config(self):
        return {"name": self.name, "encoder": keras.saving.serialize_keras_object(self.encoder)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        encoder = keras.saving.deserialize_keras_object(config.pop("encoder"))
        return cls(encoder, **config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ClassifierHead(keras.layers.Layer):
    """Scores a whole sequence from its first ([CLS]) vector: BERT's pooler (dense + tanh),
    dropout, then a linear layer onto the labels.

    Args:
        num_labels: number of classes.
        dropout: dropout rate on the pooled vector.

    Sublayers: `pooler` (Dense d_model, tanh: where an imported Hugging Face BERT's
    `bert.pooler.dense` goes), `dropout`, `logits` (Dense num_labels, computed in float32: the
    softmax of the loss needs the precision, and the layer is tiny).

    Call: sequence (batch, seq, d) -> logits (batch, num_labels) float32.

    Example:
        head = ClassifierHead(num_labels=2, dropout=0.1)
        logits = head(encoder(inputs))  # (batch, 2)
    """

    def __init__(self, num_labels: int, dropout: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        self.dropout = dropout

    def build(self, sequence_shape):
        d_model = sequence_shape[-1]
        self.pooler = keras.layers.Dense(d_model, activation="tanh", name="pooler", dtype=self.dtype_policy)
        self.pooler.build((None, d_model))
        self._dropout = keras.layers.Dropout(self.dropout, name="dropout", dtype=self.dtype_policy)
        self.logits = keras.layers.Dense(self.num_labels, name="logits", dtype="float32")
        self.logits.build((None, d_model))

    def call(self, sequence, training=None):
        pooled = self.pooler(sequence[:, 0, :])  # (batch, d): the [CLS] position
        return self.logits(ops.cast(self._dropout(pooled, training=training), "float32"))  # (batch, labels)

    def compute_output_shape(self, sequence_shape):
        return (sequence_shape[0], self.num_labels)

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels, "dropout": self.dropout}


@keras.saving.register_keras_serializable(package=PACKAGE)
class Classifier(keras.Model):
    """Encoder + classifier head, for text classification.

    Inputs: token_ids, padding_mask (batch, seq); token_ids start with [CLS].
    Output: (batch, num_labels) float32 logits.
    """

    def __init__(self, encoder: TransformerEncoder, num_labels: int, dropout: float = 0.1, **kwargs):
        inputs = {
            "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input((None,), dtype="bool", name="padding_mask"),
        }
        sequence = encoder(inputs)
        head = ClassifierHead(num_labels, dropout, name="classifier_head", dtype=encoder.dtype_policy)
        logits = head(sequence)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.encoder = encoder
        self.head = head
        self.num_labels = num_labels
        self.dropout = dropout

    def get_config(self):
        return {"name": self.name, "encoder": keras.saving.serialize_keras_object(self.encoder),
                "num_labels": self.num_labels, "dropout": self.dropout}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        encoder = keras.saving.deserialize_keras_object(config.pop("encoder"))
        return cls(encoder, **config)


def build_encoder(config: ModelConfig, vocab_size: int, max_length: int, dtype=None) -> TransformerEncoder:
    """The encoder of a model config; max_length is the number of positions it holds
    (callers pass `config.max_length or data.seq_len`)."""
    return TransformerEncoder(
        vocab_size=vocab_size, max_length=max_length, d_model=config.d_model,
        num_layers=config.num_layers, num_heads=config.num_heads, dff=config.dff,
        dropout=config.dropout, norm=config.norm, position=config.position,
        activation=config.activation, dtype=dtype, name="encoder",
    )


def build_masked_lm(config: ModelConfig, vocab_size: int, max_length: int, dtype=None) -> MaskedLM:
    """The pretraining model for a model config; `dtype` is a Keras dtype policy name
    (e.g. "mixed_bfloat16")."""
    return MaskedLM(build_encoder(config, vocab_size, max_length, dtype), name="masked_lm")


def build_classifier(config: ModelConfig, vocab_size: int, max_length: int, num_labels: int,
                     dtype=None) -> Classifier:
    """The classification model for a model config: encoder + ClassifierHead (dropout:
    config.dropout); `dtype` is a Keras dtype policy name."""
    return Classifier(build_encoder(config, vocab_size, max_length, dtype), num_labels, config.dropout,
                      name="classifier")
