"""The encoder-decoder Transformer for translation and summarization."""

from __future__ import annotations

import keras

from trainformer.config import ModelConfig
from trainformer.model.decoder import TransformerDecoder
from trainformer.model.encoder import EncoderModel, TransformerEncoder
from trainformer.model.heads import build_encoder
from trainformer.model.layers import PACKAGE, ReversibleEmbedding


@keras.saving.register_keras_serializable(package=PACKAGE)
class Seq2Seq(EncoderModel):
    """Encoder + decoder: source ids -> logits over the next target token at every position.

    Args:
        encoder: a TransformerEncoder (its weights may come from a pretraining run: the attribute
            is `encoder`, as in MaskedLM and Classifier).
        decoder_layers: decoder blocks; heads, dff, dropout, norm, position, activation, biases
            and gating are the encoder's.
        target_length: the longest target (decoder positions).
        tie_embeddings: True: one embedding for source, target and output (a joint vocabulary);
            False: the decoder has its own, tied to its output layer.
        copy_source: True: a pointer-generator (decoder.SourceCopy): the output may copy source
            tokens, and is log-probabilities, which every consumer of logits takes as they are.

    Inputs: source_ids, source_mask (batch, s); target_ids, target_mask (batch, t): the target
    shifted right ([CLS] first). Output: (batch, t, vocab) float32 logits.
    Decoding (model/search.py): `model.encode(...)`, then `model.decoder.start/step`.
    """

    def __init__(self, encoder: TransformerEncoder, decoder_layers: int, target_length: int,
                 tie_embeddings: bool = True, copy_source: bool = False, **kwargs):
        inputs = {name: keras.Input((None,), dtype=dtype, name=name) for name, dtype in
                  (("source_ids", "int32"), ("source_mask", "bool"), ("target_ids", "int32"), ("target_mask", "bool"))}
        if tie_embeddings:
            embedding = encoder.token_embedding
        else:
            embedding = ReversibleEmbedding(encoder.vocab_size, encoder.d_model, name="decoder_token_embedding",
                                            embeddings_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                                            dtype=encoder.dtype_policy)
        # A rope encoder's decoder adds sinusoidal vectors: its cached step turns no queries and keys
        decoder_position = "sinusoidal" if encoder.position == "rope" else encoder.position
        decoder = TransformerDecoder(embedding, target_length, decoder_layers, encoder.num_heads, encoder.dff,
                                     encoder.dropout, encoder.norm, decoder_position, encoder.activation,
                                     copy_source, encoder.use_bias, encoder.glu, name="decoder",
                                     dtype=encoder.dtype_policy)
        memory = encoder({"token_ids": inputs["source_ids"], "padding_mask": inputs["source_mask"]})
        logits = decoder(inputs["target_ids"], memory, inputs["source_mask"], inputs["source_ids"])
        super().__init__(inputs=inputs, outputs=logits, **kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.decoder_layers = decoder_layers
        self.target_length = target_length
        self.tie_embeddings = tie_embeddings
        self.copy_source = copy_source

    def encode(self, source_ids, source_mask):
        """(batch, s) ids and mask -> the encoder output (batch, s, d), for decoding."""
        return self.encoder({"token_ids": source_ids, "padding_mask": source_mask}, training=False)

    def get_config(self):
        return {"name": self.name, "encoder": keras.saving.serialize_keras_object(self.encoder),
                "decoder_layers": self.decoder_layers, "target_length": self.target_length,
                "tie_embeddings": self.tie_embeddings, "copy_source": self.copy_source}


def build_seq2seq(config: ModelConfig, vocab_size: int, source_length: int, target_length: int,
                  dtype=None) -> Seq2Seq:
    """The translation/summarization model of a model config (decoder_layers 0: num_layers)."""
    encoder = build_encoder(config, vocab_size, source_length, dtype)
    return Seq2Seq(encoder, config.decoder_layers or config.num_layers, target_length, config.tie_embeddings,
                   config.copy_source, name="seq2seq")
