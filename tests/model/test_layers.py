"""Transformer building blocks: shapes, serialization, the math of each layer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainformer.model.layers import (
    ACTIVATIONS,
    Dropout,
    LayerNorm,
    LearnedPositionalEmbedding,
    NgramEmbedding,
    PositionalEncoding,
    ReversibleEmbedding,
    TransformerEncoderBlock,
    attend,
    attention_probabilities,
    feed_forward_activation,
    fused_attention,
    gelu,
    gelu_exact,
    padding_keep,
    rotate,
    squared_relu,
)

RNG = np.random.default_rng(0)


def run_layer_test(layer, inputs, expected_shape=None, **call_kwargs):
    """Call `layer`, check its output shape (and compute_output_shape), then rebuild it from
    get_config(), copy the weights, and check the clone computes exactly the same thing."""
    output = np.asarray(layer(inputs, training=False, **call_kwargs))
    expected_shape = expected_shape or inputs.shape
    assert output.shape == tuple(expected_shape)
    config = layer.get_config()
    # symbolic shape inference (what functional models use) agrees with the eager result
    symbolic_kwargs = {k: keras.KerasTensor(v.shape, dtype=v.dtype.name) for k, v in call_kwargs.items()}
    symbolic = type(layer).from_config(config)(keras.KerasTensor(inputs.shape, dtype=inputs.dtype.name), **symbolic_kwargs)
    assert tuple(symbolic.shape) == tuple(expected_shape)
    if type(layer).compute_output_shape is not keras.layers.Layer.compute_output_shape:
        assert tuple(layer.compute_output_shape(inputs.shape)) == tuple(expected_shape)
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    clone(inputs, training=False, **call_kwargs)  # build
    assert [w.shape for w in clone.weights] == [w.shape for w in layer.weights]
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(np.asarray(clone(inputs, training=False, **call_kwargs)), output)
    # and through Keras' registered-object serialization, as .keras files use it
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(revived) is type(layer) and revived.get_config() == config
    return output


def random(*shape):
    return RNG.normal(size=shape).astype("float32")


# --- positions ------------------------------------------------------------------------------

def test_positional_encoding_layer_contract():
    run_layer_test(PositionalEncoding(max_length=16), random(2, 10, 8))


def test_positional_encoding_values():
    d, layer = 8, PositionalEncoding(max_length=16)
    table = np.asarray(layer(np.zeros((1, 12, d), "float32")))[0]  # zero input: the table itself
    np.testing.assert_array_equal(table[0, 0::2], 0.0)  # sin(0)
    np.testing.assert_array_equal(table[0, 1::2], 1.0)  # cos(0)
    for pos in (1, 5, 11):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i] == pytest.approx(np.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-6)
    x = random(3, 12, d)
    np.testing.assert_allclose(np.asarray(layer(x)), x + table[None], atol=1e-6)  # added, per position
    assert layer.weights == [] and layer.trainable_weights == []


def test_learned_positional_embedding():
    layer = LearnedPositionalEmbedding(max_length=16)
    x = random(2, 10, 8)
    run_layer_test(layer, x)
    assert [tuple(w.shape) for w in layer.trainable_weights] == [(16, 8)]
    positions = layer.get_weights()[0]
    np.testing.assert_allclose(np.asarray(layer(x)), x + positions[None, :10], atol=1e-6)


# --- encoder block --------------------------------------------------------------------------

def test_block_parameter_count_matches_the_seed():
    """d_model 512, 8 heads, dff 2048: the "Attention Is All You Need" base encoder layer."""
    block = TransformerEncoderBlock(num_heads=8, dff=2048)
    block.build((None, 64, 512))
    assert block.count_params() == 3_152_384
    shapes = sorted(tuple(w.shape) for w in block.weights)
    assert (512, 1536) in shapes and (512, 2048) in shapes and (2048, 512) in shapes


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_block_layer_contract(norm):
    x = random(2, 10, 32)
    mask = np.ones((2, 10), bool)
    mask[1, 7:] = False
    out = run_layer_test(TransformerEncoderBlock(num_heads=4, dff=64, norm=norm), x, padding_mask=mask)
    assert np.all(np.isfinite(out))


def test_post_norm_output_is_normalized_and_pre_norm_is_not():
    x = 3.0 * random(2, 10, 32) + 1.0
    post = np.asarray(TransformerEncoderBlock(num_heads=4, dff=64, norm="post")(x))
    pre = np.asarray(TransformerEncoderBlock(num_heads=4, dff=64, norm="pre")(x))
    np.testing.assert_allclose(post.mean(-1), 0.0, atol=1e-4)  # LayerNorm last, gamma=1 beta=0
    np.testing.assert_allclose(post.std(-1), 1.0, atol=1e-3)
    assert np.abs(pre.std(-1) - 1.0).max() > 0.5  # the residual stream is left alone


def test_block_rejects_bad_arguments():
    with pytest.raises(ValueError, match="norm"):
        TransformerEncoderBlock(num_heads=2, dff=8, norm="sandwich")
    with pytest.raises(ValueError, match="divisible"):
        TransformerEncoderBlock(num_heads=3, dff=8).build((None, 4, 32))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_mask_hides_padded_positions(norm):
    block = TransformerEncoderBlock(num_heads=4, dff=64, norm=norm)
    x = random(2, 10, 32)
    mask = np.ones((2, 10), bool)
    mask[0, 7:] = False
    mask[1, 4:] = False
    noisy = x.copy()
    noisy[~mask] = 5.0 * random(int((~mask).sum()), 32)
    base = np.asarray(block(x, padding_mask=mask, training=False))
    changed = np.asarray(block(noisy, padding_mask=mask, training=False))
    np.testing.assert_allclose(changed[mask], base[mask], atol=1e-5)
    # the check can fail: without the mask the same change leaks into real positions...
    unmasked = np.asarray(block(noisy, training=False))
    assert np.abs(unmasked[mask] - np.asarray(block(x, training=False))[mask]).max() > 1e-3
    # ...and with it, a change at a real position does reach the other real positions
    real = x.copy()
    real[0, 0] = random(32)  # (a constant shift would vanish in pre-norm's LayerNorm)
    moved = np.asarray(block(real, padding_mask=mask, training=False))
    assert np.abs(moved[0, 1:7] - base[0, 1:7]).max() > 1e-3


@pytest.mark.parametrize("mask", ["padding", "causal", "none"])
def test_fused_attention_equals_the_explicit_softmax(mask):
    """Under JAX without dropout `attend` is one ops.dot_product_attention (cuDNN's fused
    kernel on a GPU); it must compute what the explicit float32 softmax computes, masks included."""
    query, key, value = (random(2, 6, 3, 4) for _ in range(3))  # (batch, seq, heads, head_dim)
    keep = {"padding": padding_keep(np.array([[1] * 6, [1] * 4 + [0] * 2], bool)),
            "causal": np.tril(np.ones((6, 6), bool))[None, None], "none": None}[mask]
    explicit = np.einsum("bhqk,bkhd->bqhd", np.asarray(attention_probabilities(query, key, keep)), value)
    np.testing.assert_allclose(np.asarray(fused_attention(query, key, value, keep)), explicit, atol=1e-6)
    np.testing.assert_allclose(np.asarray(attend(query, key, value, keep)), explicit.reshape(2, 6, 12), atol=1e-6)
    # with dropout in training the probabilities are dropped: two calls differ
    dropout = keras.layers.Dropout(0.5)
    first, second = (np.asarray(attend(query, key, value, keep, dropout, training=True)) for _ in range(2))
    assert np.abs(first - second).max() > 1e-3


def test_tensorflow_attends_without_raw_einsum():
    """On TF, attention without dropout takes the explicit path: Keras' TF dot_product_attention
    is raw tf.einsum, which oneDNN runs as the slower _MklEinsum (benchmarks/README.md, issue 21)."""
    query = tf.constant(random(2, 6, 3, 4))
    graph = tf.function(lambda q: attend(q, q, q)).get_concrete_function(query).graph
    ops_used = {op.type for op in graph.get_operations()}
    assert "Einsum" not in ops_used and "BatchMatMulV2" in ops_used


def test_dropout_only_in_training():
    block = TransformerEncoderBlock(num_heads=4, dff=64, dropout=0.3)
    x = random(2, 10, 32)
    first, second = (np.asarray(block(x, training=True)) for _ in range(2))
    assert np.abs(first - second).max() > 1e-3
    a, b = (np.asarray(block(x, training=False)) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(block(x)), a)  # default: inference


def test_dropout_layer_contract():
    run_layer_test(Dropout(0.1, seed=3), random(2, 10, 32))


def test_dropout_drops_its_rate_exactly_in_bf16_and_scales_the_rest():
    # Keras' own dropout draws bf16 uniforms and drops 10.16% here: 5 standard errors off at 2^20 draws
    drop = Dropout(0.1, seed=3, dtype="mixed_bfloat16")
    x = tf.ones([16, 256, 256])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = drop(x, training=True)
    dropped = float(tf.reduce_mean(tf.cast(y == 0, tf.float32)))
    assert abs(dropped - 0.1) < 0.0008
    kept = tf.cast(y, tf.float32)[y != 0]
    np.testing.assert_array_equal(kept.numpy(), np.full(kept.shape, float(tf.cast(1 / 0.9, tf.bfloat16))))
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), tf.cast(y, tf.float32).numpy())  # mask / 0.9
    np.testing.assert_array_equal(np.asarray(drop(x, training=False)), np.asarray(tf.cast(x, tf.bfloat16)))


def test_dropout_masks_follow_the_seed_state():
    x = tf.ones([4, 33])  # odd: the last draw of the last uint32 goes unused
    first, second = Dropout(0.5, seed=7), Dropout(0.5, seed=7)
    a = np.asarray(first(x, training=True))
    np.testing.assert_array_equal(np.asarray(second(x, training=True)), a)  # same seed, same mask
    assert (np.asarray(first(x, training=True)) != a).any()  # the state advanced: a new mask


# --- tied embedding -------------------------------------------------------------------------

def test_reversible_embedding_layer_contract():
    ids = RNG.integers(0, 50, (2, 7)).astype("int32")
    run_layer_test(ReversibleEmbedding(50, 16), ids, expected_shape=(2, 7, 16))


def test_reverse_is_matmul_with_embedding_transpose_in_float32():
    layer = ReversibleEmbedding(50, 16)
    layer.build((None,))
    x = random(2, 3, 16)
    logits = layer(x, reverse=True)
    assert logits.dtype == "float32"
    assert tuple(layer.compute_output_shape((2, 3, 16), reverse=True)) == (2, 3, 50)
    matrix = layer.get_weights()[0]
    assert matrix.shape == (50, 16)
    np.testing.assert_allclose(np.asarray(logits), x @ matrix.T, rtol=1e-5, atol=1e-6)
    ids = np.array([[3, 49]], "int32")
    np.testing.assert_array_equal(np.asarray(layer(ids)), matrix[ids])


def test_reverse_gives_float32_from_a_bf16_matmul_under_mixed_precision():
    layer = ReversibleEmbedding(50, 16, dtype="mixed_bfloat16")
    hidden = layer(np.array([[1, 2, 3]], "int32"))
    assert hidden.dtype == "bfloat16"
    assert layer.embeddings.dtype == "float32"  # the variable stays float32
    logits = layer(hidden, reverse=True)
    assert logits.dtype == "float32"
    logits = np.asarray(logits)
    # computed in bf16, rounded once: every logit is a bf16 number
    np.testing.assert_array_equal(np.asarray(keras.ops.cast(keras.ops.cast(logits, "bfloat16"), "float32")), logits)
    matrix = np.asarray(keras.ops.cast(keras.ops.cast(layer.embeddings, "bfloat16"), "float32"))
    expected = np.asarray(keras.ops.cast(hidden, "float32")) @ matrix.T
    # 2^-7: with AVX512-BF16 or AMX oneDNN accumulates in float32 and the result is within 2^-8;
    # on an AVX2-only CPU its bf16 path rounds once more (0.70% at most on a Zen 3 EPYC)
    np.testing.assert_allclose(logits, expected, rtol=2**-7, atol=1e-6)


# --- character n-grams ----------------------------------------------------------------------

def ngram_vectors(table, ids):
    """NgramEmbedding's output, written out: at each position the sum of the rows of every
    bigram and trigram covering it, a window's row its ids hashed (order first), 0 outside."""
    buckets, (batch, length) = len(table), ids.shape
    out = np.zeros((batch, length, table.shape[1]), np.float32)
    for b in range(batch):
        padded = [0, 0, *ids[b], 0, 0]
        for t in range(length):
            for order in (2, 3):
                for start in range(t - order + 1, t + 1):
                    bucket = order
                    for token in padded[start + 2:start + 2 + order]:
                        bucket = (bucket * NgramEmbedding.PRIME + int(token)) % buckets
                    out[b, t] += table[bucket]
    return out


def test_ngram_embedding_layer_contract():
    ids = RNG.integers(0, 50, (2, 7)).astype("int32")
    run_layer_test(NgramEmbedding(97, 16, embeddings_initializer="random_normal"), ids, expected_shape=(2, 7, 16))


def test_ngram_embedding_sums_the_hashed_windows_around_each_position():
    layer = NgramEmbedding(97, 8, embeddings_initializer="random_normal")
    ids = np.array([[2, 40, 41, 42, 3, 0], [2, 40, 41, 3, 0, 0]], "int32")
    out = np.asarray(layer(ids))
    np.testing.assert_allclose(out, ngram_vectors(np.asarray(layer.embeddings), ids), rtol=1e-5, atol=1e-6)
    # a token reaches the positions two either side of it, no further
    changed = ids.copy()
    changed[0, 3] = 7
    moved = np.abs(np.asarray(layer(changed)) - out)[0].max(axis=-1)
    assert moved[1:6].min() > 0 and moved[0] == 0
    assert np.asarray(layer(ids[:, :1])).shape == (2, 1, 8)  # shorter than the windows' reach


def test_ngram_embedding_starts_as_the_encoder_without_ngrams():
    """The table starts at zeros: pretraining with n-grams starts from the same function."""
    from trainformer.model.encoder import TransformerEncoder

    sizes = dict(vocab_size=50, max_length=8, d_model=16, num_layers=1, num_heads=2, dff=32)
    plain, with_ngrams = TransformerEncoder(**sizes), TransformerEncoder(**sizes, ngram_buckets=97)
    for layer in plain.layers:
        if layer.weights:
            with_ngrams.get_layer(layer.name).set_weights(layer.get_weights())
    ids = RNG.integers(1, 50, (2, 8)).astype("int32")
    inputs = {"token_ids": ids, "padding_mask": ids != 0}
    np.testing.assert_array_equal(np.asarray(with_ngrams(inputs)), np.asarray(plain(inputs)))
    assert not np.asarray(with_ngrams.get_layer("ngram_embedding").embeddings).any()


def test_a_bias_free_encoder_is_the_biased_one_with_zero_biases():
    """use_bias=False drops the blocks' projection biases and nothing else: with the biases of
    a biased encoder at zero and its other weights copied, both compute the same function."""
    from trainformer.model.encoder import TransformerEncoder

    sizes = dict(vocab_size=50, max_length=8, d_model=16, num_layers=2, num_heads=2, dff=32)
    biased, bias_free = TransformerEncoder(**sizes), TransformerEncoder(**sizes, use_bias=False)
    dropped = {w.path for w in biased.weights if "block_" in w.path and w.path.endswith("/bias")}
    assert len(dropped) == 2 * 4 and len(biased.weights) - len(bias_free.weights) == len(dropped)
    kept = {w.path: w for w in bias_free.weights}
    for weight in biased.weights:
        if weight.path in dropped:
            weight.assign(np.zeros(weight.shape, "float32"))
        else:
            kept[weight.path].assign(weight)
    ids = RNG.integers(1, 50, (2, 8)).astype("int32")
    inputs = {"token_ids": ids, "padding_mask": ids != 0}
    np.testing.assert_allclose(np.asarray(bias_free(inputs)), np.asarray(biased(inputs)), rtol=1e-6, atol=1e-6)
    assert TransformerEncoder.from_config(bias_free.get_config()).use_bias is False


def test_a_gated_block_multiplies_the_activated_gate_into_the_inner_projection():
    """glu: the feed-forward is ffn_output(gelu(x W_gate) * x W_inner) (GEGLU); in training on
    the TF backend the fused kernel (fused_activation.fused_gated) gives the same values and
    the same gradients as the plain ops."""
    from trainformer.model.layers import TransformerEncoderBlock, gelu

    block = TransformerEncoderBlock(num_heads=2, dff=24, dropout=0.0, norm="pre", glu=True)
    x = tf.constant(RNG.normal(size=(2, 5, 16)).astype("float32"))
    y = block(x)
    h = block._residual(x, block._attention_norm, lambda h: block._attention(h, None, False), False)
    n = block._ffn_norm(h)

    def project(dense, v):
        return v @ dense.kernel + dense.bias

    expected = h + project(block._ffn_output, gelu(project(block._ffn_gate, n)) * project(block._ffn_inner, n))
    np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-5)

    def values_and_gradients(training):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = block(x, training=training)
            loss = tf.reduce_sum(out * tf.cos(out))
        return [out, *tape.gradient(loss, [x, *block.trainable_weights])]

    for fused, plain in zip(values_and_gradients(True), values_and_gradients(False)):
        np.testing.assert_allclose(np.asarray(fused), np.asarray(plain), rtol=1e-4, atol=1e-5)
    assert TransformerEncoderBlock.from_config(block.get_config()).glu is True


def test_rotary_scores_depend_on_the_offset_and_its_sign():
    """RoPE: rotations keep lengths, and a query-key product depends only on where the key
    stands relative to the query, left and right told apart."""
    query, key = random(4), random(4)
    rows = np.zeros((1, 8, 1, 4), "float32")  # (batch, seq, heads, head_dim)

    def score(query_at, key_at):
        queries, keys = rows.copy(), rows.copy()
        queries[0, query_at, 0], keys[0, key_at, 0] = query, key
        queries, keys = (np.asarray(t) for t in rotate(queries, keys))
        return float(queries[0, query_at, 0] @ keys[0, key_at, 0])

    (turned,) = (np.asarray(t) for t in rotate(np.broadcast_to(query, (1, 8, 1, 4)).copy()))
    np.testing.assert_allclose(np.linalg.norm(turned, axis=-1), np.linalg.norm(query), rtol=1e-5)
    np.testing.assert_allclose(turned[0, 0, 0], query)  # position 0 is not turned
    np.testing.assert_allclose(score(5, 2), score(6, 3), rtol=1e-4)
    assert abs(score(5, 2) - score(2, 5)) > 1e-3


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_rotate_trains_fused_with_the_plain_values_and_gradients(dtype, tolerance):
    """The training path (one XLA kernel each way; the gradient is the opposite rotation) against
    autodiff of the plain ops, for a query and a key at once."""
    query, key = (tf.constant(random(2, 9, 3, 8)) for _ in range(2))
    upstream = [random(2, 9, 3, 8), random(2, 9, 3, 8)]

    def run(training):
        with tf.GradientTape() as tape:
            tape.watch([query, key])
            turned = rotate(tf.cast(query, dtype), tf.cast(key, dtype), training=training)
            total = sum(tf.reduce_sum(tf.cast(t, tf.float32) * u) for t, u in zip(turned, upstream))
        assert all(t.dtype == dtype for t in turned)
        return [np.asarray(tf.cast(t, tf.float32)) for t in (*turned, *tape.gradient(total, [query, key]))]

    for fused, plain in zip(run(True), run(False)):
        np.testing.assert_allclose(fused, plain, rtol=tolerance, atol=tolerance)


def rotary_encoder(position="rope"):
    from trainformer.model.encoder import TransformerEncoder

    return TransformerEncoder(vocab_size=50, max_length=8, d_model=16, num_layers=2, num_heads=2, dff=32,
                              norm="pre", position=position)


def test_a_rotary_encoder_reads_a_text_the_same_wherever_it_stands():
    """No position vectors: a token's vector depends on where the others stand relative to it.
    So a text moved along its padding reads the same (what lets a model pretrained on 64-token
    windows read a 256-token review with what it learned), yet order counts, direction included:
    reversed or with two tokens swapped, the vectors change. Sinusoidal positions, the control,
    read the moved text otherwise."""
    encoder = rotary_encoder()
    assert not [w for w in encoder.weights if "position" in w.path]
    text, moved, reversed_, swapped = (np.array([ids], "int32") for ids in
                                       ([5, 9, 14, 3, 0, 0], [0, 0, 5, 9, 14, 3], [3, 14, 9, 5, 0, 0], [9, 5, 14, 3, 0, 0]))

    def vectors(model, token_ids):
        return np.asarray(model({"token_ids": token_ids, "padding_mask": token_ids != 0}))[0]

    base = vectors(encoder, text)
    np.testing.assert_allclose(vectors(encoder, moved)[2:], base[:4], atol=1e-5)
    assert np.abs(vectors(encoder, reversed_)[:4] - base[3::-1]).max() > 1e-3
    assert np.abs(vectors(encoder, swapped)[2:4] - base[2:4]).max() > 1e-3
    sinusoidal = rotary_encoder("sinusoidal")
    sinusoidal.set_weights(encoder.get_weights())
    assert np.abs(vectors(sinusoidal, moved)[2:] - vectors(sinusoidal, text)[:4]).max() > 1e-3
    assert type(encoder).from_config(encoder.get_config()).get_layer("block_0").rotary


@pytest.mark.parametrize("layer_class", [PositionalEncoding, LearnedPositionalEmbedding])
def test_position_layers_implement_compute_output_shape(layer_class):
    assert tuple(layer_class(max_length=16).compute_output_shape((2, 10, 8))) == (2, 10, 8)


# --- activations ----------------------------------------------------------------------------

def test_exact_gelu_is_the_erf_form_and_exports_without_erfc():
    x = np.linspace(-8, 8, 2001).astype("float32")
    exact = np.asarray(gelu_exact(x))
    np.testing.assert_allclose(exact, np.asarray(keras.activations.gelu(x, approximate=False)), atol=2e-6)
    assert np.abs(exact - np.asarray(gelu(x))).max() > 1e-4  # the tanh form is another function
    graph = tf.function(gelu_exact).get_concrete_function(tf.TensorSpec([None], tf.float32)).graph
    ops_used = {op.type for op in graph.get_operations()}
    assert "Erf" in ops_used and "Erfc" not in ops_used  # tf2onnx converts Erf, not Erfc (DESIGN.md)


def test_squared_relu_is_zero_below_and_the_square_above():
    x = np.array([-3.0, -0.5, 0.0, 0.5, 3.0], "float32")
    np.testing.assert_allclose(np.asarray(squared_relu(x)), [0.0, 0.0, 0.0, 0.25, 9.0])


def value_and_gradient(function, x, upstream):
    """function(x) and d sum(function(x) * upstream) / dx, as float32 arrays."""
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = function(x)
        total = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    return np.asarray(tf.cast(y, tf.float32)), np.asarray(tf.cast(tape.gradient(total, x), tf.float32))


@pytest.mark.parametrize("name", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_fused_training_activation_has_the_plain_values_and_gradient(name, dtype, tolerance):
    # the training path's hand-written derivative against autodiff of the plain ops, each in
    # float32: a wrong derivative is off by far more than rounding (1 - tanh^2 near the tails
    # is where float32 rounding shows: 1e-5 there)
    x = np.linspace(-6, 6, 4001).astype("float32")
    upstream = np.random.default_rng(1).normal(size=x.shape).astype("float32")
    fused = feed_forward_activation(name, training=True)
    assert fused is not ACTIVATIONS[name] and feed_forward_activation(name, training=False) is ACTIVATIONS[name]
    expected = value_and_gradient(ACTIVATIONS[name], x, upstream)
    got = value_and_gradient(fused, tf.cast(x, dtype), upstream)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=tolerance, atol=tolerance)
    assert fused(tf.cast(x, dtype)).dtype == dtype  # its input's dtype back, whatever it computes in


def xla_ops(layer, x, training):
    """The ops of layer(x)'s graph that XLA must compile."""
    graph = tf.function(lambda t: layer(t, training=training)).get_concrete_function(x).graph
    return [op for op in graph.get_operations() if op.node_def.attr["_XlaMustCompile"].b]


def test_block_trains_with_the_fused_activation_and_infers_with_the_plain_one():
    # without dropout, training changes only how the activation runs: the same output and gradient
    block = TransformerEncoderBlock(num_heads=4, dff=64, dropout=0.0)
    x = tf.constant(random(2, 10, 32))
    upstream = random(2, 10, 32)
    values = [value_and_gradient(lambda t, training=training: block(t, training=training), x, upstream)
              for training in (True, False)]
    for trained, inferred in zip(*values):
        np.testing.assert_allclose(trained, inferred, atol=1e-5)

    assert xla_ops(block, x, True) and not xla_ops(block, x, False)  # an export traces training off: no XLA there


@pytest.mark.parametrize("dtype, tolerance", [("float32", 2e-5), ("mixed_bfloat16", 2e-2)])
def test_layer_norm_trains_fused_with_keras_values_and_gradients(dtype, tolerance):
    """LayerNorm's training path (one XLA kernel each way, a hand-written gradient) against Keras'
    own ops (its inference path): the output and the gradients of x, gamma and beta."""
    norm = LayerNorm(epsilon=1e-6, dtype=dtype)
    x = tf.constant(random(3, 7, 32) * 3 + 1)  # off-centre, not unit scale: every term of the gradient counts
    norm.build(x.shape)
    norm.gamma.assign(random(32) + 1)
    norm.beta.assign(random(32))
    upstream = random(3, 7, 32)

    def run(training):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = norm(x, training=training)
            total = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
        return [np.asarray(tf.cast(t, tf.float32)) for t in (y, *tape.gradient(total, [x, norm.gamma, norm.beta]))]

    for fused, keras_ops in zip(run(True), run(False)):
        np.testing.assert_allclose(fused, keras_ops, rtol=tolerance, atol=tolerance * np.abs(keras_ops).max())
    assert norm(x, training=True).dtype == norm.compute_dtype

    assert xla_ops(norm, x, True) and not xla_ops(norm, x, False)  # an export traces training off: no XLA there


def test_block_activation_is_stored_and_used():
    x = random(2, 10, 32)
    mask = np.ones((2, 10), bool)
    mask[1, 6:] = False
    exact = TransformerEncoderBlock(num_heads=4, dff=64, activation="gelu")
    out = run_layer_test(exact, x, padding_mask=mask)
    assert exact.get_config()["activation"] == "gelu"
    assert TransformerEncoderBlock(num_heads=4, dff=64).get_config()["activation"] == "gelu_tanh"  # the default
    approximate = TransformerEncoderBlock(num_heads=4, dff=64, activation="gelu_tanh")
    approximate(x, padding_mask=mask)
    approximate.set_weights(exact.get_weights())
    assert np.abs(np.asarray(approximate(x, padding_mask=mask)) - out).max() > 1e-5
    with pytest.raises(ValueError, match="activation"):
        TransformerEncoderBlock(num_heads=2, dff=8, activation="relu")
