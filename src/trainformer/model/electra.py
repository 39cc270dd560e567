"""ELECTRA pretraining (Clark et al. 2020): a small generator fills the masked positions, the
encoder (the discriminator) tells, at every position, whether a token was replaced.

Replaced-token detection learns from all positions instead of the 15% that are masked, which
is what makes ELECTRA the most compute-efficient pretraining objective at small scale
(DESIGN.md "Quality per compute"). After pretraining the generator is dropped: the encoder is
what `model.init_from` takes (`Electra.encoder`, as with MaskedLM).

The generator shares the discriminator's token embedding (input and tied output) and width;
it is shallower (ELECTRA found a generator 1/4-1/2 the discriminator's size best: a strong
generator makes the task too hard). Its samples are drawn by inverse-CDF from one uniform per
masked position that the data pipeline supplies (`sample_uniform`), so a batch, its samples
included, is a pure function of (seed, batch number): resumes stay bitwise.
"""

from __future__ import annotations

import keras
from keras import ops

from trainformer.model.encoder import EncoderModel, TransformerEncoder, add_positions
from trainformer.model.heads import MaskedLMHead
from trainformer.model.layers import (
    PACKAGE,
    LayerNorm,
    TransformerEncoderBlock,
    activation_function,
)
from trainformer.tokens import NUM_SPECIAL


def sample_tokens(logits, uniform):
    """One token per row of logits by inverse-CDF sampling, never a special token.

    logits: (batch, P, vocab) float32; uniform: (batch, P) in [0, 1) -> (batch, P) int32.
    The sample is the first id whose cumulative probability exceeds the uniform.
    """
    vocab = ops.shape(logits)[-1]
    special = ops.arange(vocab) < NUM_SPECIAL  # (vocab,)
    logits = ops.where(special, -1e9, ops.stop_gradient(logits))
    cumulative = ops.cumsum(ops.softmax(logits, axis=-1), axis=-1)  # (batch, P, vocab)
    below = ops.sum(ops.cast(cumulative <= ops.expand_dims(uniform, -1), "int32"), axis=-1)
    return ops.minimum(below, vocab - 1)  # rounding may leave the last cumulative just under 1


def replace_at(token_ids, positions, real, values):
    """token_ids (batch, S) with values (batch, P) written at positions (batch, P) where real."""
    hit = ops.one_hot(positions, ops.shape(token_ids)[1], dtype="int32") * ops.expand_dims(real, -1)  # (b, P, S)
    written = ops.sum(hit, axis=1) > 0  # (batch, S)
    return ops.where(written, ops.sum(hit * ops.expand_dims(values, -1), axis=1), token_ids)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ReplaceMasked(keras.layers.Layer):
    """Writes a generator sample into every masked position and labels what was replaced.

    Call: token_ids (batch, S), masked_positions and masked_ids (batch, P) int32 (slot
    position 0 marks padding: [CLS] is never masked), generator_logits (batch, P, vocab),
    sample_uniform (batch, P) -> corrupted ids (batch, S) int32 and replaced (batch, S)
    float32: 1 where a sample differs from the original token (a sample equal to it counts
    as original, as in ELECTRA).
    """

    def call(self, token_ids, masked_positions, masked_ids, generator_logits, sample_uniform):
        sampled = sample_tokens(generator_logits, sample_uniform)  # (batch, P)
        real = ops.cast(masked_positions > 0, "int32")
        corrupted = replace_at(token_ids, masked_positions, real, sampled)
        differs = ops.cast(sampled != masked_ids, "int32")
        replaced = replace_at(ops.zeros_like(token_ids), masked_positions, real, differs)
        return corrupted, ops.cast(replaced, "float32")

    def compute_output_shape(self, token_ids_shape, *shapes):
        return token_ids_shape, token_ids_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class ReplacedTokenHead(keras.layers.Layer):
    """ELECTRA's discriminator head: dense + GELU, then one logit per position (was this token
    replaced?), in float32.

    Call: sequence (batch, seq, d) -> logits (batch, seq) float32.
    """

    def __init__(self, activation: str = "gelu_tanh", **kwargs):
        super().__init__(**kwargs)
        activation_function(activation)
        self.activation = activation

    def build(self, sequence_shape):
        d_model = sequence_shape[-1]
        self._transform = keras.layers.Dense(d_model, activation=activation_function(self.activation),
                                             name="transform", dtype=self.dtype_policy)
        self._transform.build((None, None, d_model))
        self._logit = keras.layers.Dense(1, name="logit", dtype="float32")
        self._logit.build((None, None, d_model))

    def call(self, sequence):
        return ops.squeeze(self._logit(ops.cast(self._transform(sequence), "float32")), -1)

    def compute_output_shape(self, sequence_shape):
        return sequence_shape[:-1]

    def get_config(self):
        return {**super().get_config(), "activation": self.activation}


def generator_sequence(encoder: TransformerEncoder, token_ids, padding_mask, num_layers: int):
    """The generator: the encoder's token embedding, then num_layers blocks of the encoder's
    width, heads and feed-forward size. -> (batch, seq, d)."""
    dtype = encoder.dtype_policy
    x = encoder.token_embedding(token_ids)  # (batch, seq, d): shared with the discriminator
    x = add_positions(x, encoder.position, encoder.max_length, encoder.d_model, dtype, prefix="generator_")
    if encoder.norm == "post":
        x = LayerNorm(epsilon=1e-12, name="generator_embeddings_norm", dtype=dtype)(x)
    for index in range(num_layers):
        block = TransformerEncoderBlock(encoder.num_heads, encoder.dff, 0.0, encoder.norm, activation=encoder.activation,
                                        use_bias=encoder.use_bias, glu=encoder.glu, rotary=encoder.position == "rope",
                                        name=f"generator_block_{index}", dtype=dtype)
        x = block(x, padding_mask=padding_mask)
    if encoder.norm == "pre":
        x = LayerNorm(epsilon=1e-12, name="generator_final_norm", dtype=dtype)(x)
    return x


@keras.saving.register_keras_serializable(package=PACKAGE)
class Electra(EncoderModel):
    """Generator + discriminator (the encoder), for ELECTRA pretraining.

    Inputs: token_ids, padding_mask (batch, seq) with the masked positions corrupted as for
    masked-LM; masked_positions, masked_ids (the original tokens there) (batch, P) int32,
    position 0 ([CLS]) in a slot that is padding; sample_uniform (batch, P) float32 in [0, 1).

    Outputs: generator_logits (batch, P, vocab) float32 at the masked positions;
    discriminator_logits (batch, seq) float32; replaced (batch, seq) float32, 1 where the
    discriminator's input differs from the original text (a sample equal to the original
    counts as original, as in ELECTRA).
    """

    def __init__(self, encoder: TransformerEncoder, generator_layers: int, **kwargs):
        inputs = {
            "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input((None,), dtype="bool", name="padding_mask"),
            "masked_positions": keras.Input((None,), dtype="int32", name="masked_positions"),
            "masked_ids": keras.Input((None,), dtype="int32", name="masked_ids"),
            "sample_uniform": keras.Input((None,), dtype="float32", name="sample_uniform"),
        }
        generated = generator_sequence(encoder, inputs["token_ids"], inputs["padding_mask"], generator_layers)
        head = MaskedLMHead(encoder.token_embedding, activation=encoder.activation, name="generator_head",
                            dtype=encoder.dtype_policy)
        generator_logits = head(generated, inputs["masked_positions"])  # (batch, P, vocab)
        corrupted, replaced = ReplaceMasked(name="replace_masked")(
            inputs["token_ids"], inputs["masked_positions"], inputs["masked_ids"], generator_logits,
            inputs["sample_uniform"])  # (batch, seq) each
        sequence = encoder({"token_ids": corrupted, "padding_mask": inputs["padding_mask"]})
        discriminator = ReplacedTokenHead(encoder.activation, name="discriminator_head", dtype=encoder.dtype_policy)
        outputs = {"generator_logits": generator_logits, "discriminator_logits": discriminator(sequence),
                   "replaced": replaced}
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.encoder = encoder
        self.generator_layers = generator_layers

    def get_config(self):
        return {"name": self.name, "encoder": keras.saving.serialize_keras_object(self.encoder),
                "generator_layers": self.generator_layers}
