"""The Transformer decoder ("Attention Is All You Need"): causal self-attention, cross-attention
onto the encoder's output, feed-forward; and its one-token step with a key/value cache.

Training runs the whole target at once (teacher forcing, a causal mask). Decoding
(model/search.py) runs `step`: the new token's keys and values are written into a cache of
fixed length, so each token costs one position instead of the whole prefix, and every shape
stays static for XLA. The cross-attention keys and values depend only on the source: `start`
computes them once per source.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from trainformer.model.layers import (
    PACKAGE,
    Dropout,
    LayerNorm,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    ReversibleEmbedding,
    TransformerBlock,
    TransformerEncoderBlock,
    attend,
    padding_keep,
    split_heads,
)


def causal_keep(length):
    """(1, 1, length, length) bool: query i may look at keys 0..i."""
    positions = ops.arange(length)
    return ops.expand_dims(ops.expand_dims(positions[None, :] <= positions[:, None], 0), 0)


def copy_weights(source: keras.layers.Layer, target: keras.layers.Layer) -> None:
    """Give target (a Dense, LayerNormalization or Embedding) the values of source's weights,
    which must have the same shapes: a copy, each layer keeps training its own."""
    if [tuple(w.shape) for w in source.weights] != [tuple(w.shape) for w in target.weights]:
        raise ValueError(f"{source.name} and {target.name} have weights of other shapes")
    for theirs, ours in zip(source.weights, target.weights):
        ours.assign(ops.convert_to_tensor(theirs))


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerDecoderBlock(TransformerBlock):
    """Causal self-attention, cross-attention onto the encoder output, GELU feed-forward; each
    with dropout and a residual connection.

    Args: those of TransformerBlock (layers.py), as the encoder block's.

    Self-attention queries, keys and values come from one fused (d, 3d) projection; the
    cross-attention's keys and values from one (d, 2d) projection of the encoder output.

    Call: (x (batch, t, d), memory (batch, s, d), memory_mask (batch, s) bool) -> (batch, t, d).
    Step: (x (batch, 1, d), index, cache, memory_kv, memory_mask) -> ((batch, 1, d), cache), see
    `step`.

    Example:
        block = TransformerDecoderBlock(num_heads=4, dff=1024)
        y = block(x, memory, memory_mask)  # (batch, t, d)
    """

    def build(self, x_shape, memory_shape=None, memory_mask_shape=None):
        d_model = x_shape[-1]
        self.head_dim = self.check_width(d_model)
        policy = self.dtype_policy

        def sublayer(layer, inner=d_model):
            layer.build((None, None, inner))
            return layer

        def dense(units, name, activation=None, inner=d_model):
            return sublayer(keras.layers.Dense(units, activation=activation, use_bias=self.use_bias, name=name,
                                               dtype=policy), inner)

        def layer_norm(name):
            return sublayer(LayerNorm(epsilon=self.epsilon, name=name, dtype=policy))

        self._self_qkv = dense(3 * d_model, "self_qkv")
        self._self_output = dense(d_model, "self_output")
        self._self_norm = layer_norm("self_norm")
        self._cross_query = dense(d_model, "cross_query")
        self._cross_kv = dense(2 * d_model, "cross_kv")
        self._cross_output = dense(d_model, "cross_output")
        self._cross_norm = layer_norm("cross_norm")
        self._ffn_inner = dense(self.dff, "ffn_inner")  # the activation comes after: _feed_forward
        if self.glu:
            self._ffn_gate = dense(self.dff, "ffn_gate")
        self._ffn_output = dense(d_model, "ffn_output", inner=self.dff)
        self._ffn_norm = layer_norm("ffn_norm")
        self._attention_dropout = Dropout(self.dropout, dtype=policy)
        self._residual_dropout = Dropout(self.dropout, dtype=policy)

    def start_from(self, block: TransformerEncoderBlock) -> None:
        """Take an encoder block's weights where this block computes what it does: the
        self-attention (fused q/k/v and output; causal here), the feed-forward and the LayerNorm
        of each. Cross-attention, which the encoder has none of, keeps its initialisation."""
        pairs = ((block._qkv, self._self_qkv), (block._attention_output, self._self_output),
                 (block._attention_norm, self._self_norm), (block._ffn_inner, self._ffn_inner),
                 (block._ffn_output, self._ffn_output), (block._ffn_norm, self._ffn_norm))
        if self.glu:
            pairs += ((block._ffn_gate, self._ffn_gate),)
        for theirs, ours in pairs:
            copy_weights(theirs, ours)

    def _split(self, x, parts):
        """(batch, t, parts * d) -> `parts` tensors (batch, t, heads, head_dim)."""
        return split_heads(x, parts, self.num_heads, self.head_dim)

    def memory_kv(self, memory):
        """The cross-attention keys and values of an encoder output: 2 x (batch, s, heads, head_dim)."""
        return self._split(self._cross_kv(memory), 2)

    def _attend(self, query, key, value, keep, output, training):
        return output(attend(query, key, value, keep, self._attention_dropout, training))

    def _cross_and_ffn(self, x, memory_kv, memory_mask, training):
        key, value = memory_kv
        keep = padding_keep(memory_mask)

        def cross(h):
            query = self._split(self._cross_query(h), 1)[0]
            return self._attend(query, key, value, keep, self._cross_output, training)

        x = self._residual(x, self._cross_norm, cross, training)
        return self._residual(x, self._ffn_norm, lambda h: self._feed_forward(h, training), training)

    def call(self, x, memory, memory_mask, training=None):
        # Only a causal mask on the targets: a padded position comes after every real one, so
        # causality already keeps real queries off it, and padded queries are not scored.
        def causal_self(h):
            query, key, value = self._split(self._self_qkv(h), 3)
            return self._attend(query, key, value, causal_keep(ops.shape(h)[1]), self._self_output, training)

        x = self._residual(x, self._self_norm, causal_self, training)
        return self._cross_and_ffn(x, self.memory_kv(memory), memory_mask, training)

    def empty_cache(self, batch, max_length, dtype):
        """Self-attention keys and values of positions 0..max_length-1, not yet computed:
        2 x (batch, max_length, heads, head_dim) zeros."""
        zeros = ops.zeros((batch, max_length, self.num_heads, self.head_dim), dtype)
        return zeros, zeros

    def step(self, x, index, cache, memory_kv, memory_mask):
        """One new position: x (batch, 1, d) at position `index` (scalar int32); cache from
        empty_cache with positions < index filled. Returns (y (batch, 1, d), cache with `index`
        filled). Equal to `call` on the whole prefix, at its last position (inference only)."""
        cached_keys, cached_values = cache
        keep = (ops.arange(ops.shape(cached_keys)[1]) <= index)[None, None, None, :]  # positions 0..index
        written = {}

        def cached_self(h):
            query, key, value = self._split(self._self_qkv(h), 3)  # each (batch, 1, heads, head_dim)
            start = (0, index, 0, 0)
            written["keys"] = ops.slice_update(cached_keys, start, ops.cast(key, cached_keys.dtype))
            written["values"] = ops.slice_update(cached_values, start, ops.cast(value, cached_values.dtype))
            return self._attend(query, written["keys"], written["values"], keep, self._self_output, False)

        x = self._residual(x, self._self_norm, cached_self, False)
        return self._cross_and_ffn(x, memory_kv, memory_mask, False), (written["keys"], written["values"])

    def compute_output_shape(self, x_shape, memory_shape=None, memory_mask_shape=None):
        return x_shape


def onto_vocabulary(weights, ids, vocab_size):
    """Each source position's weight added onto its token's id (a token the source holds twice
    gets both): weights (batch, t, s) float32, ids (batch, s) int32 -> (batch, t, vocab).

    A scatter-add: with the (batch, s, vocab) one-hot product it replaces, beam search decoded
    1.4x slower (benchmarks/seq2seq/README.md, "Copying")."""
    grid = batch, steps, _ = ops.shape(weights)
    rows = ops.broadcast_to(ops.reshape(ops.arange(batch, dtype="int32"), (-1, 1, 1)), grid)
    columns = ops.broadcast_to(ops.reshape(ops.arange(steps, dtype="int32"), (1, -1, 1)), grid)
    tokens = ops.broadcast_to(ops.cast(ids, "int32")[:, None, :], grid)
    return ops.scatter(ops.stack([rows, columns, tokens], axis=-1), weights, (batch, steps, vocab_size))


@keras.saving.register_keras_serializable(package=PACKAGE)
class SourceCopy(keras.layers.Layer):
    """The pointer-generator's copy (See et al. 2017, "Get To The Point: Summarization with
    Pointer-Generator Networks"): each target position may copy a source token instead of
    generating one from the vocabulary.

    One attention head from the decoder's output onto the encoder's weighs the source positions
    (a); a gate p_gen = sigmoid(w . [h, context] + b), context = a @ memory, mixes the two:

        p(w) = p_gen * softmax(logits)(w) + (1 - p_gen) * sum of a_i over positions i holding w

    Source and target share one vocabulary (a seq2seq run has one tokenizer), so a copied id
    needs no extended vocabulary. The result is a log-distribution: log_softmax leaves it as it
    is, so the loss and the searches take it where they took logits.

    Call: (hidden (batch, t, d), logits (batch, t, vocab) float32, memory_keys (batch, s, d) from
    `keys`, memory (batch, s, d), memory_mask (batch, s) bool, source_ids (batch, s) int32) ->
    log p (batch, t, vocab) float32.
    """

    def __init__(self, **kwargs):
        # No autocast: a bf16 policy would round the float32 logits; the Dense layers cast
        # their own inputs, the rest is computed in float32 here.
        super().__init__(autocast=False, **kwargs)

    def build(self, hidden_shape, *shapes):
        d_model = hidden_shape[-1]
        self._query = keras.layers.Dense(d_model, name="query", dtype=self.dtype_policy)
        self._key = keras.layers.Dense(d_model, name="key", dtype=self.dtype_policy)
        self._gate = keras.layers.Dense(1, name="gate", dtype=self.dtype_policy)
        self._query.build((None, None, d_model))
        self._key.build((None, None, d_model))
        self._gate.build((None, None, 2 * d_model))

    def keys(self, memory):
        """(batch, s, d) encoder output -> its copy keys (batch, s, d): once per source."""
        return self._key(memory)

    def call(self, hidden, logits, memory_keys, memory, memory_mask, source_ids):
        query = ops.cast(self._query(hidden), "float32")  # (batch, t, d)
        scores = ops.einsum("btd,bsd->bts", query, ops.cast(memory_keys, "float32"))
        scores = ops.where(memory_mask[:, None, :], scores / math.sqrt(hidden.shape[-1]), -1e9)
        attention = ops.softmax(scores, axis=-1)  # (batch, t, s)
        context = ops.einsum("bts,bsd->btd", attention, ops.cast(memory, "float32"))
        gate = ops.cast(self._gate(ops.concatenate([ops.cast(hidden, "float32"), context], axis=-1)), "float32")
        copied = onto_vocabulary(attention, source_ids, ops.shape(logits)[-1])  # (batch, t, vocab)
        generated = ops.log_sigmoid(gate) + ops.log_softmax(logits, axis=-1)
        # 1e-9: an id no source holds gets a finite log (and gradient) from the copy side
        return ops.logaddexp(generated, ops.log_sigmoid(-gate) + ops.log(copied + 1e-9))

    def compute_output_shape(self, hidden_shape, logits_shape, *shapes):
        return logits_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerDecoder(keras.layers.Layer):
    """Target embedding + positions + decoder blocks (+ final LayerNorm for "pre") + the output
    projection, tied to the target token embedding (+ the pointer-generator's copy, SourceCopy).

    Args:
        token_embedding: the ReversibleEmbedding of target tokens (the encoder's when the model
            ties embeddings); its matrix is also the output layer. Rebuilt by the owning model,
            not serialised here.
        max_length: the longest target (decoder positions).
        num_layers, num_heads, dff, dropout, norm, position, activation, use_bias, glu: as the encoder's.
        copy_source: True: the output mixes in copies of source tokens (SourceCopy); its
            log-probabilities stand where the logits stood.

    Call: (target_ids (batch, t), memory (batch, s, d), memory_mask (batch, s), source_ids
    (batch, s): read only with copy_source) -> logits (batch, t, vocab) float32.
    Decoding: state = start(memory, memory_mask, max_length, source_ids); logits, state =
    step(ids, index, state).
    """

    def __init__(self, token_embedding: ReversibleEmbedding, max_length: int, num_layers: int, num_heads: int,
                 dff: int, dropout: float = 0.1, norm: str = "post", position: str = "sinusoidal",
                 activation: str = "gelu_tanh", copy_source: bool = False, use_bias: bool = True, glu: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.max_length = max_length
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        self.position = position
        self.activation = activation
        self.copy_source = copy_source
        self.use_bias = use_bias
        self.glu = glu

    def build(self, target_ids_shape, memory_shape=None, memory_mask_shape=None, source_ids_shape=None):
        d_model = self.token_embedding.output_dim
        policy = self.dtype_policy
        if not self.token_embedding.built:  # an untied embedding: only the decoder calls it
            self.token_embedding.build((None, None))
        positions = PositionalEncoding if self.position == "sinusoidal" else LearnedPositionalEmbedding
        self._positions = positions(self.max_length, name="positions", dtype=policy)
        self._positions.build((None, None, d_model))
        self._embedding_norm = None
        if self.norm == "post":
            self._embedding_norm = LayerNorm(epsilon=1e-12, name="embeddings_norm", dtype=policy)
            self._embedding_norm.build((None, None, d_model))
        self._dropout = Dropout(self.dropout, dtype=policy)
        for index in range(self.num_layers):
            block = TransformerDecoderBlock(self.num_heads, self.dff, self.dropout, self.norm, activation=self.activation,
                                            use_bias=self.use_bias, glu=self.glu, name=f"block_{index}", dtype=policy)
            block.build((None, None, d_model))
            # An attribute each, not a list: TF checkpoints do not see the layers of a Keras-tracked list
            setattr(self, f"block_{index}", block)
        self._final_norm = None
        if self.norm == "pre":
            self._final_norm = LayerNorm(epsilon=1e-12, name="final_norm", dtype=policy)
            self._final_norm.build((None, None, d_model))
        self.output_bias = self.add_weight(name="output_bias", shape=(self.token_embedding.input_dim,),
                                           initializer="zeros")
        self._copy = None
        if self.copy_source:
            self._copy = SourceCopy(name="source_copy", dtype=policy)
            self._copy.build((None, None, d_model))

    @property
    def blocks(self) -> list[TransformerDecoderBlock]:
        return [getattr(self, f"block_{index}") for index in range(self.num_layers)]

    def warm_start_from(self, encoder) -> None:
        """Start this (built) decoder from a pretrained encoder, as BERT2BERT does (Rothe et al.
        2020, "Leveraging Pre-trained Checkpoints for Sequence Generation Tasks"): block i takes
        encoder block i's self-attention, feed-forward and LayerNorms (TransformerDecoderBlock.
        start_from); the embedding LayerNorm (post) or final LayerNorm (pre) and the learned
        position vectors (as many as both have) take the encoder's; an untied token embedding
        takes the encoder's values (a tied one is the encoder's already). Cross-attention and
        the output bias (and the copy) keep their initialisation: the encoder has nothing that
        computes them.

        encoder: a TransformerEncoder with the same width and at least as many blocks (a
        decoder with more would have blocks no pretraining trained: ValueError).
        """
        if self.num_layers > encoder.num_layers:
            raise ValueError(f"{self.num_layers} decoder blocks cannot start from {encoder.num_layers} encoder blocks")
        for index, block in enumerate(self.blocks):
            block.start_from(encoder.get_layer(f"block_{index}"))
        norm = {"post": ("embeddings_norm", self._embedding_norm), "pre": ("final_norm", self._final_norm)}[self.norm]
        copy_weights(encoder.get_layer(norm[0]), norm[1])
        if self.position == "learned":
            self._start_positions_from(encoder.get_layer("position_embedding").positions)
        if self.token_embedding is not encoder.token_embedding:
            copy_weights(encoder.token_embedding, self.token_embedding)

    def _start_positions_from(self, table) -> None:
        """The first positions of the encoder's learned table (all of ours when it has as many)."""
        ours = self._positions.positions
        shared = min(ours.shape[0], table.shape[0])
        rows = ops.convert_to_tensor(table)[:shared]
        ours.assign(ops.concatenate([rows, ops.convert_to_tensor(ours)[shared:]], axis=0))

    def _embed(self, target_ids, start, training):
        x = self.token_embedding(target_ids)  # (batch, t, d)
        if self.position == "sinusoidal":
            x = x * ops.cast(math.sqrt(self.token_embedding.output_dim), x.dtype)  # as the encoder does
        x = self._positions(x, start=start)
        if self._embedding_norm is not None:
            x = self._embedding_norm(x)
        return self._dropout(x, training=training)

    def _logits(self, x, copy_inputs):
        """The blocks' output (batch, t, d) -> (batch, t, vocab) float32: logits, or with
        copy_source the log-probabilities that mix in the copy (copy_inputs: _copy_inputs')."""
        if self._final_norm is not None:
            x = self._final_norm(x)
        logits = self.token_embedding(x, reverse=True) + ops.cast(self.output_bias, "float32")
        return self._copy(x, logits, *copy_inputs) if self._copy is not None else logits

    def _copy_inputs(self, memory, memory_mask, source_ids) -> tuple:
        """What the copy reads of a batch of sources (empty without copy_source)."""
        if self._copy is None:
            return ()
        if source_ids is None:
            raise ValueError("a decoder with copy_source needs the source_ids")
        return self._copy.keys(memory), memory, memory_mask, source_ids

    def call(self, target_ids, memory, memory_mask, source_ids=None, training=None):
        x = self._embed(target_ids, 0, training)
        for block in self.blocks:
            x = block(x, memory, memory_mask, training=training)
        return self._logits(x, self._copy_inputs(memory, memory_mask, source_ids))

    def start(self, memory, memory_mask, max_length: int, source_ids=None) -> dict:
        """The decoding state of a batch of encoded sources: each block's cross-attention keys
        and values, its empty self-attention cache for max_length positions, and what the copy
        reads. Every tensor has the batch first, so a beam search can reorder or repeat rows of
        the whole state."""
        batch = ops.shape(memory)[0]
        return {"memory_mask": memory_mask,
                "memory_kv": [block.memory_kv(memory) for block in self.blocks],
                "cache": [block.empty_cache(batch, max_length, memory.dtype) for block in self.blocks],
                "copy": self._copy_inputs(memory, memory_mask, source_ids)}

    def step(self, token_ids, index, state: dict):
        """token_ids (batch,) int32 at position `index` -> (logits (batch, vocab) float32 for the
        next position, state with `index` cached)."""
        x = self._embed(ops.expand_dims(token_ids, 1), index, False)  # (batch, 1, d)
        caches = []
        for block, memory_kv, cache in zip(self.blocks, state["memory_kv"], state["cache"]):
            x, cache = block.step(x, index, cache, memory_kv, state["memory_mask"])
            caches.append(cache)
        return self._logits(x, state["copy"])[:, 0, :], {**state, "cache": caches}

    def compute_output_shape(self, target_ids_shape, memory_shape=None, memory_mask_shape=None,
                             source_ids_shape=None):
        return (*target_ids_shape, self.token_embedding.input_dim)

    def get_config(self):
        # The (possibly shared) embedding is rebuilt by the model that owns it.
        return {**super().get_config(), "max_length": self.max_length, "num_layers": self.num_layers,
                "num_heads": self.num_heads, "dff": self.dff, "dropout": self.dropout, "norm": self.norm,
                "position": self.position, "activation": self.activation, "copy_source": self.copy_source,
                "use_bias": self.use_bias, "glu": self.glu}
