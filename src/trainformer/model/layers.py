"""Transformer building blocks as Keras 3 layers (KerasHub conventions: every constructor
argument stored and returned by get_config, sublayers created in build() with explicit names
and the layer's dtype policy)."""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

PACKAGE = "trainformer"


def gelu(x):
    """tanh-approximate GELU (activation "gelu_tanh"; HF "gelu_new" / "gelu_pytorch_tanh")."""
    return keras.activations.gelu(x, approximate=True)


def gelu_derivative(x):
    """d gelu / dx: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(c (x + a x^3))."""
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    squared = ops.square(x)
    t = ops.tanh(c * x * (1.0 + a * squared))
    return 0.5 * (1.0 + t) + (0.5 * c) * x * (1.0 - ops.square(t)) * (1.0 + (3.0 * a) * squared)


def gelu_exact(x):
    """Exact GELU, x * Phi(x) (activation "gelu"; HF BERT's "gelu").

    Written with erf: Keras' own exact gelu lowers to Erfc, which tf2onnx cannot convert.
    """
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def gelu_exact_derivative(x):
    """d gelu_exact / dx = Phi(x) + x phi(x)."""
    density = ops.exp(-0.5 * ops.square(x)) * (1.0 / math.sqrt(2.0 * math.pi))  # phi(x)
    return 0.5 * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0)))) + x * density


def squared_relu(x):
    """relu(x)^2 (activation "relu2"; HF "relu2"): Primer's feed-forward activation (So et al.
    2021, better per step than GELU in their language models). Cheaper than GELU as TF's ops (two
    element-wise passes against GELU's eight); in training, where both are fused
    (feed_forward_activation), zh-bert-small's bf16 CPU step is 1.02-1.06x GELU's."""
    return ops.square(ops.relu(x))


def squared_relu_derivative(x):
    """d squared_relu / dx = 2 relu(x)."""
    return 2.0 * ops.relu(x)


ACTIVATIONS = {"gelu_tanh": gelu, "gelu": gelu_exact, "relu2": squared_relu}
DERIVATIVES = {"gelu_tanh": gelu_derivative, "gelu": gelu_exact_derivative, "relu2": squared_relu_derivative}


def activation_function(name: str):
    """The feed-forward activation of a config name (ModelConfig.activation)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def feed_forward_activation(name: str, training=None, gated: bool = False):
    """The activation a block applies to its feed-forward's inner projection; gated (model.glu):
    a function of (gate, value), activation(gate) * value. Training on the TF backend: the same
    function with its forward and its backward each one XLA kernel (model/fused_activation.py:
    a fifth of the time on a CPU). Otherwise, and in every exported graph (traced with training
    off): the plain ops, which any runtime runs."""
    function = activation_function(name)
    if training and keras.backend.backend() == "tensorflow":
        from trainformer.model.fused_activation import fused, fused_gated

        return (fused_gated if gated else fused)(function, DERIVATIVES[name])
    return (lambda gate, value: function(gate) * value) if gated else function


def attention_probabilities(query, key, keep=None):
    """Scaled dot-product softmax over the keys, in float32 (softmax in fp32 under mixed precision).

    query (batch, q, heads, head_dim), key (batch, k, heads, head_dim); keep: None or a bool mask
    broadcastable to (batch, heads, q, k), False where a query must not look (padding, the future).
    Returns (batch, heads, q, k).
    """
    query = query * (1.0 / math.sqrt(query.shape[-1]))
    scores = ops.cast(ops.einsum("bqhd,bkhd->bhqk", query, key), "float32")  # (batch, heads, q, k)
    if keep is not None:
        scores = ops.where(keep, scores, -1e9)
    return ops.softmax(scores, axis=-1)


def attention_context(probs, value):
    """probs (batch, heads, q, k) x value (batch, k, heads, head_dim) -> (batch, q, heads, head_dim)."""
    return ops.einsum("bhqk,bkhd->bqhd", probs, value)


def attend(query, key, value, keep=None, dropout=None, training=None):
    """Scaled dot-product attention of every head, merged: (batch, q, heads * head_dim).

    query (batch, q, heads, head_dim), key and value (batch, k, heads, head_dim); keep as in
    `attention_probabilities`; dropout: the Dropout layer applied to the probabilities.

    Under JAX, without dropout (inference, or a rate of 0), this is one
    `ops.dot_product_attention`, which Keras' JAX backend runs as cuDNN's fused kernel on a GPU.
    That kernel refuses a (batch, 1, 1, k) mask, so the mask is broadcast to (batch, 1, q, k).
    Dropout needs the probabilities themselves, so training with it takes the explicit path;
    so does TensorFlow always: its `dot_product_attention` is two `tf.einsum`s, which oneDNN
    runs as _MklEinsum, slower on CPUs than the transposes and batch matmuls `ops.einsum`
    makes of the same contractions (benchmarks/README.md, issue 21).
    """
    batch, length = ops.shape(query)[0], ops.shape(query)[1]
    dropping = training and dropout is not None and dropout.rate > 0
    if dropping or keras.backend.backend() != "jax":
        probs = ops.cast(attention_probabilities(query, key, keep), query.dtype)  # (batch, heads, q, k)
        context = attention_context(dropout(probs, training=training) if dropping else probs, value)
    else:
        context = fused_attention(query, key, value, keep)
    return ops.reshape(context, (batch, length, value.shape[2] * value.shape[3]))


def fused_attention(query, key, value, keep=None):
    """`ops.dot_product_attention` of attend's arguments: (batch, q, heads, head_dim)."""
    if keep is not None:
        keep = ops.broadcast_to(keep, (ops.shape(query)[0], 1, ops.shape(query)[1], ops.shape(key)[1]))
    return ops.dot_product_attention(query, key, value, mask=keep)


def split_heads(x, parts: int, num_heads: int, head_dim: int):
    """A fused projection (batch, t, parts * heads * head_dim) -> `parts` tensors (batch, t, heads, head_dim).

    split, not x[:, :, i]: the gradient of each slice is a zero-filled full-size tensor (TF's
    StridedSliceGrad, JAX's pad; `parts` of them per block, then summed), the gradient of a
    split is one concatenation. Measured 14% less step time at bert-mini-bench on CPU.
    """
    batch, length = ops.shape(x)[0], ops.shape(x)[1]
    x = ops.reshape(x, (batch, length, parts, num_heads, head_dim))
    return tuple(ops.squeeze(part, 2) for part in ops.split(x, parts, axis=2))


def rotary_rates(head_dim: int) -> np.ndarray:
    """(head_dim / 2,) float32: the angle per position of each of rotate's feature pairs, 10000^(-2i / head_dim)."""
    return (10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)).astype("float32")


def rotate(*tensors, training=None):
    """Rotary position embedding (RoPE; Su et al. 2021, RoFormer): each pair of features
    (i, i + head_dim / 2) at position t turned by the angle t * 10000^(-2i / head_dim), so a
    query-key product depends on the two positions' offset, and its sign: relative and
    directional, with no position vectors. Each tensor (batch, seq, heads, head_dim), all of
    one shape (a block's query and key: the angles are computed once) -> a tuple of them turned.
    Training on the TF backend: one XLA kernel forward and one backward (model/fused_rotary.py).
    """
    if training and keras.backend.backend() == "tensorflow":
        from trainformer.model.fused_rotary import fused_rotate

        return fused_rotate(*tensors)
    length, head_dim, dtype = ops.shape(tensors[0])[1], tensors[0].shape[-1], tensors[0].dtype
    angles = ops.expand_dims(ops.arange(length, dtype="float32"), 1) * rotary_rates(head_dim)  # (seq, head_dim / 2)
    # reshape, not [None, :, None, :]: TFLite has no StridedSlice with new axes (padding_keep)
    cos, sin = (ops.cast(ops.reshape(ops.tile(f(angles), (1, 2)), (1, length, 1, head_dim)), dtype)
                for f in (ops.cos, ops.sin))  # each (1, seq, 1, head_dim)

    def turned(x):
        first, second = ops.split(x, 2, axis=-1)  # split, not slices: see split_heads
        return x * cos + ops.concatenate([-second, first], axis=-1) * sin

    return tuple(turned(x) for x in tensors)


def padding_keep(padding_mask):
    """A (batch, seq) padding mask -> the (batch, 1, 1, seq) bool `keep` of the attention
    functions; None stays None."""
    if padding_mask is None:
        return None
    # expand_dims, not [:, None, None, :]: TFLite has no StridedSlice with new axes
    return ops.expand_dims(ops.expand_dims(ops.cast(padding_mask, "bool"), 1), 1)


@keras.saving.register_keras_serializable(package=PACKAGE)
class LayerNorm(keras.layers.LayerNormalization):
    """keras.layers.LayerNormalization whose training step, on the TF backend, is one XLA kernel
    forward and one backward (model/fused_norm.py: ~5% of zh-bert-small's step on a CPU).
    Inference, every export (traced with training off) and the other backends run Keras' ops.
    The fused path covers the usual form, the last axis with gamma and beta."""

    def call(self, inputs, training=None):
        usual = self.axis in (-1, [-1], [len(inputs.shape) - 1]) and self.center and self.scale and not self.rms_scaling
        if training and usual and keras.backend.backend() == "tensorflow":
            from trainformer.model.fused_norm import fused_layer_norm

            outputs = fused_layer_norm(inputs, ops.cast(self.gamma, "float32"), ops.cast(self.beta, "float32"),
                                       self.epsilon)
            return ops.cast(outputs, self.compute_dtype)
        return super().call(inputs)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Dropout(keras.layers.Dropout):
    """keras.layers.Dropout whose training masks, on the TF backend, come from 16 random bits
    per element (bits_dropout.py: 2.2x faster than TF's uniform floats, a fine-tune ~1.03x, and
    the rate exact in bf16). Other backends, inference and a noise_shape keep Keras' own
    dropout. The seeds are the layer's SeedGenerator's, as in Keras, so checkpoints restore the
    masks' sequence (train/checkpoint.py dropout_seed_states).

    Example:
        drop = Dropout(0.1, dtype="mixed_bfloat16")
        y = drop(x, training=True)   # x's shape: ~10% zeros, the rest x / 0.9
    """

    def call(self, inputs, training=False):
        if training and self.rate > 0 and self.noise_shape is None and keras.backend.backend() == "tensorflow":
            from trainformer.model.bits_dropout import bits_dropout

            return bits_dropout(inputs, self.rate, self.seed_generator.next())
        return super().call(inputs, training=training)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionalEncoding(keras.layers.Layer):
    """Adds the fixed sinusoidal position encoding of "Attention Is All You Need".

    PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Args:
        max_length: the longest sequence the layer accepts.

    Example:
        x = PositionalEncoding(max_length=128)(embeddings)  # (batch, seq, d) -> same shape
    """

    def __init__(self, max_length: int, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length

    def build(self, input_shape):
        depth = input_shape[-1]
        positions = np.arange(self.max_length)[:, None]  # (max_length, 1)
        rates = 1.0 / np.power(10000.0, np.arange(0, depth, 2) / depth)  # (depth/2,)
        table = np.zeros([self.max_length, depth], np.float32)
        table[:, 0::2] = np.sin(positions * rates)
        table[:, 1::2] = np.cos(positions * rates)
        self._table = table  # a constant, not a weight: nothing to train or checkpoint

    def call(self, inputs, start=0):
        """start: the position of inputs' first vector (a decoder step adds position `index`)."""
        table = ops.slice(ops.convert_to_tensor(self._table), (start, 0), (ops.shape(inputs)[1], self._table.shape[1]))
        return inputs + ops.cast(table, inputs.dtype)[None]  # (batch, seq, d)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length}


@keras.saving.register_keras_serializable(package=PACKAGE)
class LearnedPositionalEmbedding(keras.layers.Layer):
    """Adds a trained position vector (BERT's position embeddings).

    Args:
        max_length: the longest sequence the layer accepts.

    Example:
        x = LearnedPositionalEmbedding(max_length=512)(embeddings)  # (batch, seq, d)
    """

    def __init__(self, max_length: int, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        self.positions = self.add_weight(
            name="positions", shape=(self.max_length, input_shape[-1]), initializer=self.initializer
        )

    def call(self, inputs, start=0):
        """start: the position of inputs' first vector (a decoder step adds position `index`)."""
        # convert_to_tensor: JAX's slice refuses a Keras variable itself
        table = ops.slice(ops.convert_to_tensor(self.positions), (start, 0),
                          (ops.shape(inputs)[1], self.positions.shape[1]))
        return inputs + ops.cast(table, inputs.dtype)[None]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "max_length": self.max_length,
            "initializer": keras.initializers.serialize(self.initializer),
        }


@keras.saving.register_keras_serializable(package=PACKAGE)
class ReversibleEmbedding(keras.layers.Embedding):
    """A token embedding that can also project hidden states back onto the vocabulary, so an
    output head shares (ties) the input embedding matrix.

    Logits come out in float32 (a softmax over a large vocabulary in bf16 would lose the small
    probabilities the loss needs) from a matmul in the compute dtype: under bf16 each logit is
    rounded once (relative 2^-9, what PyTorch's autocast does to an LM head) and the projection
    runs on the CPU's bf16 units, 5.4x faster than in float32 for zh-bert-small's masked
    positions (640 x 256 x 8,000: 2.8 against 15.2 ms on a 2-core Xeon with AMX), 1.12x its
    training step (docs/measured.md).

    Example:
        embed = ReversibleEmbedding(vocab_size, d_model)
        x = embed(token_ids)              # (batch, seq) -> (batch, seq, d)
        logits = embed(x, reverse=True)   # (batch, seq, d) -> (batch, seq, vocab) float32
    """

    def call(self, inputs, reverse: bool = False):
        if not reverse:
            return super().call(inputs)
        matrix = ops.cast(self.embeddings, self.compute_dtype)  # (vocab, d)
        return ops.cast(ops.matmul(ops.cast(inputs, self.compute_dtype), ops.transpose(matrix)), "float32")

    def compute_output_shape(self, input_shape, reverse: bool = False):
        if reverse:
            return (*input_shape[:-1], self.input_dim)
        return super().compute_output_shape(input_shape)


@keras.saving.register_keras_serializable(package=PACKAGE)
class NgramEmbedding(keras.layers.Embedding):
    """The character n-grams around each token, as one vector per token (ZEN, Diao et al. 2020;
    fastText's hashed n-grams, Bojanowski et al. 2017): the sum of the vectors of every bigram
    and trigram that covers the position, each found by hashing its token ids into `input_dim`
    buckets. Chinese words are mostly 2-3 characters: a character model otherwise has to
    rebuild them with attention, from few examples on a small corpus.

    The hashes are computed from the ids the model is given, so a masked position's n-grams
    hold [MASK], never the token it hides. Ids outside the sequence count as padding (id 0).
    The table starts at zeros: at step 0 the encoder is the one without n-grams.

    Example:
        ngrams = NgramEmbedding(32768, d_model)
        x = token_embedding(ids) + ngrams(ids)   # (batch, seq) -> (batch, seq, d)
    """

    ORDERS = (2, 3)
    # The hash multiplier: with at most config.MAX_NGRAM_BUCKETS buckets, bucket * PRIME + a
    # token id stays inside int32, the dtype of token ids everywhere (export included).
    PRIME = 10007

    def __init__(self, input_dim: int, output_dim: int, embeddings_initializer="zeros", **kwargs):
        super().__init__(input_dim, output_dim, embeddings_initializer=embeddings_initializer, **kwargs)

    def call(self, token_ids):
        ids = ops.cast(token_ids, "int32")  # (batch, seq)
        reach = max(self.ORDERS) - 1
        shifted = {offset: shift(ids, offset) for offset in range(-reach, reach + 1)}  # ids[t + offset]
        windows = []  # each (batch, seq): the bucket of one n-gram covering every position
        for order in self.ORDERS:
            for start in range(-(order - 1), 1):  # the window's first token, relative to t
                bucket = ops.full_like(ids, order)  # seeded: else (pad, a, b) hashes as (a, b)
                for offset in range(start, start + order):
                    bucket = ops.mod(bucket * self.PRIME + shifted[offset], self.input_dim)
                windows.append(bucket)
        vectors = super().call(ops.stack(windows, axis=-1))  # (batch, seq, windows, d)
        return ops.sum(vectors, axis=-2)  # (batch, seq, d)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)


def shift(ids, offset: int):
    """(batch, seq) ids moved so that position t holds ids[t + offset], and 0 (padding) where
    that falls outside the sequence (also when the sequence is shorter than the offset)."""
    if offset > 0:
        return ops.pad(ids, [[0, 0], [0, offset]])[:, offset:]
    if offset < 0:
        return ops.pad(ids, [[0, 0], [-offset, 0]])[:, :offset]
    return ids


class TransformerBlock(keras.layers.Layer):
    """What the encoder and decoder blocks share: their arguments, their check of the width,
    and the residual connection around each sublayer.

    Args:
        num_heads: attention heads; the model width must divide by it.
        dff: inner width of the feed-forward network.
        dropout: dropout rate on attention probabilities and on every residual branch.
        norm: "post" (LayerNorm after each residual add: BERT and the seed article) or "pre"
            (LayerNorm before each sublayer: more stable at high learning rates and depth).
        epsilon: LayerNorm epsilon.
        activation: the feed-forward activation: "gelu_tanh" (tanh approximation), "gelu" (exact,
            erf form: BERT's) or "relu2" (relu squared, Primer's).
        use_bias: whether the attention and feed-forward projections add a bias (BERT's do;
            Cramming drops them: fewer element-wise passes per step).
        glu: a gated feed-forward (Shazeer 2020, "GLU Variants Improve Transformer"; GEGLU with
            gelu): activation(x W_gate) * (x W_inner), then W_output. Three projections of dff,
            so 2/3 of a plain one's dff holds the same parameters.
    """

    def __init__(self, num_heads: int, dff: int, dropout: float = 0.1, norm: str = "post",
                 epsilon: float = 1e-12, activation: str = "gelu_tanh", use_bias: bool = True, glu: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        if norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {norm!r}")
        activation_function(activation)  # a bad name fails here, not at build
        self.num_heads = num_heads
        self.dff = dff
        self.dropout = dropout
        self.norm = norm
        self.epsilon = epsilon
        self.activation = activation
        self.use_bias = use_bias
        self.glu = glu

    def check_width(self, d_model: int) -> int:
        """The head size of a model width."""
        if d_model % self.num_heads:
            raise ValueError(f"width {d_model} is not divisible by num_heads={self.num_heads}")
        return d_model // self.num_heads

    def _residual(self, x, norm, sublayer, training):
        """x + dropout(sublayer(x)), with LayerNorm before the sublayer (pre) or after the add (post)."""
        if self.norm == "pre":
            return x + self._residual_dropout(sublayer(norm(x)), training=training)
        return norm(x + self._residual_dropout(sublayer(x), training=training))

    def _feed_forward(self, x, training):
        """(batch, seq, d) -> (batch, seq, d): ffn_output(activation(ffn_inner(x))), or with glu
        ffn_output(activation(ffn_gate(x)) * ffn_inner(x))."""
        activation = feed_forward_activation(self.activation, training, gated=self.glu)
        inner = self._ffn_inner(x)  # (batch, seq, dff)
        inner = activation(self._ffn_gate(x), inner) if self.glu else activation(inner)
        return self._ffn_output(inner)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "dff": self.dff, "dropout": self.dropout,
                "norm": self.norm, "epsilon": self.epsilon, "activation": self.activation, "use_bias": self.use_bias,
                "glu": self.glu}


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerEncoderBlock(TransformerBlock):
    """Self-attention + GELU feed-forward, each with dropout and a residual connection.

    Args: those of TransformerBlock, and
        rotary: rotate queries and keys by their positions (RoPE, `rotate`), for an encoder
            that adds no position vectors.

    Query, key and value come from one fused (d, 3d) projection: one matmul instead of three,
    with the same parameter count as separate ones.

    Example:
        block = TransformerEncoderBlock(num_heads=8, dff=2048)
        y = block(x, padding_mask=mask)  # x (batch, seq, d), mask (batch, seq) bool -> (batch, seq, d)
        probs = block.attention_probabilities(x, padding_mask=mask)  # (batch, heads, seq, seq) float32
    """

    def __init__(self, *args, rotary: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.rotary = rotary

    def build(self, input_shape):
        d_model = input_shape[-1]
        self.head_dim = self.check_width(d_model)
        policy = self.dtype_policy

        def dense(units, name, activation=None):
            return keras.layers.Dense(units, activation=activation, use_bias=self.use_bias, name=name, dtype=policy)

        def layer_norm(name):
            return LayerNorm(epsilon=self.epsilon, name=name, dtype=policy)

        self._qkv = dense(3 * d_model, "qkv")
        self._qkv.build(input_shape)
        self._attention_output = dense(d_model, "attention_output")
        self._attention_output.build(input_shape)
        self._attention_norm = layer_norm("attention_norm")
        self._attention_norm.build(input_shape)
        self._ffn_inner = dense(self.dff, "ffn_inner")  # the activation comes after: _feed_forward
        self._ffn_inner.build(input_shape)
        if self.glu:
            self._ffn_gate = dense(self.dff, "ffn_gate")
            self._ffn_gate.build(input_shape)
        self._ffn_output = dense(d_model, "ffn_output")
        self._ffn_output.build((*input_shape[:-1], self.dff))
        self._ffn_norm = layer_norm("ffn_norm")
        self._ffn_norm.build(input_shape)
        self._attention_dropout = Dropout(self.dropout, dtype=policy)
        self._residual_dropout = Dropout(self.dropout, dtype=policy)

    def call(self, x, padding_mask=None, training=None):
        x = self._residual(x, self._attention_norm, lambda h: self._attention(h, padding_mask, training), training)
        return self._residual(x, self._ffn_norm, lambda h: self._feed_forward(h, training), training)

    def attention_probabilities(self, x, padding_mask=None):
        """Every head's attention weights, as `call` computes them before dropout.

        Args:
            x: the block input (batch, seq, d), the same tensor `call` takes (with norm="pre"
                the LayerNorm before attention is applied here too).
            padding_mask: (batch, seq) bool, False at padded keys.

        Returns:
            (batch, heads, seq_q, seq_k) float32; each row sums to 1 over the keys.

        `call` runs the same `_heads` and this softmax (or, under JAX without dropout,
        `ops.dot_product_attention`, equal within float rounding: tested): a displayed map is
        what the model attends with.
        """
        h = self._attention_norm(x) if self.norm == "pre" else x
        query, key, _ = self._heads(h)
        return attention_probabilities(query, key, padding_keep(padding_mask))

    def _heads(self, x, training=None):
        """Fused projection -> query, key, value, each (batch, seq, heads, head_dim); with
        rotary, query and key rotated by their positions."""
        query, key, value = split_heads(self._qkv(x), 3, self.num_heads, self.head_dim)
        return (*rotate(query, key, training=training), value) if self.rotary else (query, key, value)

    def _attention(self, x, padding_mask, training):
        query, key, value = self._heads(x, training)  # each (batch, seq, heads, head_dim)
        return self._attention_output(attend(query, key, value, padding_keep(padding_mask),
                                             self._attention_dropout, training))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rotary": self.rotary}
