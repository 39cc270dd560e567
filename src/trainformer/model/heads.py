"""Task heads on top of the encoder."""

from __future__ import annotations

import keras
from keras import ops

from trainformer.config import ModelConfig
from trainformer.model.encoder import EncoderModel, TransformerEncoder
from trainformer.model.layers import PACKAGE, Dropout, LayerNorm, ReversibleEmbedding, activation_function

POOLINGS = ("cls", "mean")  # what a ClassifierHead's pooler reads: [CLS], or the mean of the tokens


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskedLMHead(keras.layers.Layer):
    """Predicts the original tokens at masked positions, with output weights tied to the
    token embedding.

    Only the masked positions are gathered before the vocabulary projection: at 15% masking
    that is ~7x less head compute than scoring every position.

    Args:
        token_embedding: the encoder's ReversibleEmbedding (its matrix is the output layer).
        epsilon: LayerNorm epsilon.
        activation: the transform's, the encoder's ("gelu_tanh", "gelu" or "relu2").

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
        self._norm = LayerNorm(epsilon=self.epsilon, name="norm", dtype=self.dtype_policy)
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
class MaskedLM(EncoderModel):
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


@keras.saving.register_keras_serializable(package=PACKAGE)
class ClassifierHead(keras.layers.Layer):
    """Scores a whole sequence from its first ([CLS]) vector, or from the mean of its vectors:
    BERT's pooler (dense + tanh), dropout, then a linear layer onto the labels.

    Args:
        num_labels: number of classes.
        dropout: dropout rate on the pooled vector.
        pooling: "cls" (the first position's vector, BERT's) or "mean" (the mean over the
            positions padding_mask marks as tokens: padding never changes the result).

    Sublayers: `pooler` (Dense d_model, tanh: where an imported Hugging Face BERT's
    `bert.pooler.dense` goes), `dropout`, `logits` (Dense num_labels, computed in float32: the
    softmax of the loss needs the precision, and the layer is tiny).

    Call: (sequence (batch, seq, d), padding_mask (batch, seq) bool, needed by "mean") -> logits
    (batch, num_labels) float32.

    Example:
        head = ClassifierHead(num_labels=2, dropout=0.1, pooling="mean")
        logits = head(encoder(inputs), inputs["padding_mask"])  # (batch, 2)
    """

    def __init__(self, num_labels: int, dropout: float = 0.1, pooling: str = "cls", **kwargs):
        super().__init__(**kwargs)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling: {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.num_labels = num_labels
        self.dropout = dropout
        self.pooling = pooling

    def build(self, sequence_shape, padding_mask_shape=None):
        d_model = sequence_shape[-1]
        self.pooler = keras.layers.Dense(d_model, activation="tanh", name="pooler", dtype=self.dtype_policy)
        self.pooler.build((None, d_model))
        self._dropout = Dropout(self.dropout, name="dropout", dtype=self.dtype_policy)
        self.logits = keras.layers.Dense(self.num_labels, name="logits", dtype="float32")
        self.logits.build((None, d_model))

    def call(self, sequence, padding_mask=None, training=None):
        if self.pooling == "mean":
            if padding_mask is None:
                raise ValueError("pooling='mean' needs the padding_mask")
            summary = masked_mean(sequence, padding_mask)
        else:
            summary = sequence[:, 0, :]  # the [CLS] position
        pooled = self.pooler(summary)  # (batch, d)
        return self.logits(ops.cast(self._dropout(pooled, training=training), "float32"))  # (batch, labels)

    def compute_output_shape(self, sequence_shape, padding_mask_shape=None):
        return (sequence_shape[0], self.num_labels)

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels, "dropout": self.dropout,
                "pooling": self.pooling}


def masked_mean(sequence, padding_mask):
    """The mean of sequence (batch, seq, d) over the positions where padding_mask is true:
    (batch, d), summed in float32 (a bf16 sum of a long text's vectors loses digits), in
    sequence's dtype. A row without any token gives zeros, not NaN."""
    weights = ops.expand_dims(ops.cast(padding_mask, "float32"), -1)  # (batch, seq, 1); not [..., None]: TFLite
    total = ops.sum(ops.cast(sequence, "float32") * weights, axis=1)
    count = ops.maximum(ops.sum(weights, axis=1), 1.0)
    return ops.cast(total / count, sequence.dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Classifier(EncoderModel):
    """Encoder + classifier head, for text classification.

    Inputs: token_ids, padding_mask (batch, seq); token_ids start with [CLS].
    Output: (batch, num_labels) float32 logits.
    pooling: the head's, "cls" or "mean" (see ClassifierHead).
    """

    def __init__(self, encoder: TransformerEncoder, num_labels: int, dropout: float = 0.1, pooling: str = "cls",
                 **kwargs):
        inputs = {
            "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input((None,), dtype="bool", name="padding_mask"),
        }
        sequence = encoder(inputs)
        head = ClassifierHead(num_labels, dropout, pooling, name="classifier_head", dtype=encoder.dtype_policy)
        # [CLS] pooling leaves the mask out of the head: its graph, and every export of it, as before
        logits = head(sequence, inputs["padding_mask"]) if pooling == "mean" else head(sequence)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.encoder = encoder
        self.head = head
        self.num_labels = num_labels
        self.dropout = dropout
        self.pooling = pooling

    def get_config(self):
        return {"name": self.name, "encoder": keras.saving.serialize_keras_object(self.encoder),
                "num_labels": self.num_labels, "dropout": self.dropout, "pooling": self.pooling}


def build_encoder(config: ModelConfig, vocab_size: int, max_length: int, dtype=None) -> TransformerEncoder:
    """The encoder of a model config; max_length is the number of positions it holds
    (callers pass `config.max_length or data.seq_len`)."""
    return TransformerEncoder(
        vocab_size=vocab_size, max_length=max_length, d_model=config.d_model,
        num_layers=config.num_layers, num_heads=config.num_heads, dff=config.dff,
        dropout=config.dropout, norm=config.norm, position=config.position,
        activation=config.activation, ngram_buckets=config.ngram_buckets, use_bias=config.use_bias, glu=config.glu,
        dtype=dtype,
        name="encoder",
    )


def build_masked_lm(config: ModelConfig, vocab_size: int, max_length: int, dtype=None) -> MaskedLM:
    """The pretraining model for a model config; `dtype` is a Keras dtype policy name
    (e.g. "mixed_bfloat16")."""
    return MaskedLM(build_encoder(config, vocab_size, max_length, dtype), name="masked_lm")


def build_classifier(config: ModelConfig, vocab_size: int, max_length: int, num_labels: int,
                     dtype=None) -> Classifier:
    """The classification model for a model config: encoder + ClassifierHead (dropout:
    config.dropout, pooling: config.pooling); `dtype` is a Keras dtype policy name."""
    return Classifier(build_encoder(config, vocab_size, max_length, dtype), num_labels, config.dropout,
                      config.pooling, name="classifier")


def layer_decay_multipliers(model: Classifier, decay: float) -> dict[str, float]:
    """Layer-wise learning-rate decay (ELECTRA's fine-tuning, Clark et al. 2020): {trainable
    variable path: learning-rate factor}. The head (pooler included: it is trained for the
    labels) gets 1, the top encoder block decay, the one below decay^2, ..., block 0
    decay^num_layers and everything under the blocks (token and position embeddings, the
    post-LN embeddings norm) decay^(num_layers + 1). A pre-LN encoder's final norm sits on
    the top block's output and goes with it.

    Found by the model's structure (which layer owns which variable), not by matching names."""
    encoder, layers = model.encoder, model.encoder.num_layers
    factors = {id(v): 1.0 for v in model.head.trainable_variables}
    for layer in encoder.layers:
        if layer.name.startswith("block_"):
            depth = layers - int(layer.name.removeprefix("block_"))  # the top block: 1
        elif layer.name == "final_norm":
            depth = 1
        else:
            depth = layers + 1  # embeddings, positions, their norm
        factors.update({id(v): decay**depth for v in layer.trainable_variables})
    multipliers = {}
    for variable in model.trainable_variables:
        if id(variable) not in factors or variable.path in multipliers:
            raise ValueError(f"layer_decay_multipliers: {variable.path} is not one variable of the encoder or head")
        multipliers[variable.path] = factors[id(variable)]
    return multipliers
