"""The encoder backbone: token embeddings + positions + a stack of Transformer blocks."""

from __future__ import annotations

import math

import keras

from trainformer.model.layers import (
    PACKAGE,
    Dropout,
    LayerNorm,
    LearnedPositionalEmbedding,
    NgramEmbedding,
    PositionalEncoding,
    ReversibleEmbedding,
    TransformerEncoderBlock,
)


def add_positions(x, position: str, max_length: int, d_model: int, dtype=None, prefix: str = ""):
    """Token vectors (batch, seq, d) -> with their positions: sinusoidal or learned vectors
    added; rope adds none (its blocks rotate queries and keys). prefix names the layers (the
    ELECTRA generator's own are generator_...)."""
    if position == "sinusoidal":
        # The fixed encoding has unit-scale entries while embeddings start at std 0.02:
        # unscaled, positions drown the token signal and training stalls at the unigram
        # plateau. Scale by sqrt(d) as in "Attention Is All You Need".
        x = keras.layers.Rescaling(math.sqrt(d_model), name=f"{prefix}embedding_scale", dtype=dtype)(x)
        return PositionalEncoding(max_length, name=f"{prefix}position_encoding", dtype=dtype)(x)
    if position == "learned":
        return LearnedPositionalEmbedding(max_length, name=f"{prefix}position_embedding", dtype=dtype)(x)
    return x


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerEncoder(keras.Model):
    """A BERT-style encoder as a functional model (KerasHub's backbone pattern).

    Args:
        vocab_size: number of token ids.
        max_length: the longest input sequence.
        d_model, num_layers, num_heads, dff, dropout: the usual Transformer sizes.
        norm: "post" (BERT, with a LayerNorm on the embeddings) or "pre" (with a final LayerNorm).
        position: "sinusoidal" (fixed) or "learned" position vectors, or "rope" (none: every
            block rotates its queries and keys by position, so attention reads offsets).
        activation: the feed-forward activation of every block: "gelu_tanh" (tanh approximation),
            "gelu" (exact, erf form: BERT's, and what an imported Hugging Face BERT uses) or
            "relu2" (relu squared, Primer's).
        ngram_buckets: 0, or the hash buckets of an NgramEmbedding added to the token vectors
            (the bigrams and trigrams around each token).
        use_bias: whether every block's projections add a bias (TransformerBlock).
        glu: whether every block's feed-forward is gated (TransformerBlock).

    Inputs: {"token_ids": (batch, seq) int32, "padding_mask": (batch, seq) bool}.
    Output: (batch, seq, d_model) contextual vectors.

    Example:
        encoder = TransformerEncoder(vocab_size=8000, max_length=128, d_model=256, num_layers=4,
                                     num_heads=4, dff=1024)
        sequence = encoder({"token_ids": ids, "padding_mask": ids != 0})
    """

    def __init__(self, vocab_size: int, max_length: int, d_model: int, num_layers: int,
                 num_heads: int, dff: int, dropout: float = 0.1, norm: str = "post",
                 position: str = "sinusoidal", activation: str = "gelu_tanh", ngram_buckets: int = 0,
                 use_bias: bool = True, glu: bool = False, dtype=None, **kwargs):
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input((None,), dtype="bool", name="padding_mask")
        token_embedding = ReversibleEmbedding(
            vocab_size, d_model, embeddings_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            name="token_embedding", dtype=dtype,
        )
        x = token_embedding(token_ids)  # (batch, seq, d)
        if ngram_buckets:
            x = x + NgramEmbedding(ngram_buckets, d_model, name="ngram_embedding", dtype=dtype)(token_ids)
        x = add_positions(x, position, max_length, d_model, dtype)
        if norm == "post":
            x = LayerNorm(epsilon=1e-12, name="embeddings_norm", dtype=dtype)(x)
        x = Dropout(dropout, name="embeddings_dropout", dtype=dtype)(x)
        for index in range(num_layers):
            block = TransformerEncoderBlock(num_heads, dff, dropout, norm, activation=activation, use_bias=use_bias,
                                            glu=glu, rotary=position == "rope", name=f"block_{index}", dtype=dtype)
            x = block(x, padding_mask=padding_mask)
        if norm == "pre":
            x = LayerNorm(epsilon=1e-12, name="final_norm", dtype=dtype)(x)
        super().__init__(inputs={"token_ids": token_ids, "padding_mask": padding_mask}, outputs=x, **kwargs)
        # A functional model drops its `dtype` argument and stays float32. Without the mixed
        # policy no autocast scope is open when the token embedding runs, so Keras autocasts the
        # whole table to bf16 before the gather: the gradient becomes a bf16 scatter-add (a
        # compare-and-swap loop on GPUs, ~20x slower than f32's atomics: openxla/xla#26371).
        # The heads and the decoder, built with this policy, would run in float32.
        if dtype is not None:
            self.dtype_policy = keras.dtype_policies.get(dtype)
        self.token_embedding = token_embedding
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.d_model = d_model
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        self.position = position
        self.activation = activation
        self.ngram_buckets = ngram_buckets
        self.use_bias = use_bias
        self.glu = glu

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
            "d_model": self.d_model,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "dff": self.dff,
            "dropout": self.dropout,
            "norm": self.norm,
            "position": self.position,
            "activation": self.activation,
            "ngram_buckets": self.ngram_buckets,
            "use_bias": self.use_bias,
            "glu": self.glu,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class EncoderModel(keras.Model):
    """A task model built around a TransformerEncoder (MaskedLM, Classifier, Seq2Seq, Electra):
    its config holds the serialized encoder under "encoder" and the model's own arguments, and
    from_config rebuilds the encoder first, then the model around it."""

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        encoder = keras.saving.deserialize_keras_object(config.pop("encoder"))
        return cls(encoder, **config)
