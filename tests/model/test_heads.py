"""The masked-LM model: encoder + head whose output matrix is the (tied) token embedding; the
classifier and its head, [CLS] or mean pooling."""

import dataclasses

import keras
import numpy as np
import pytest

from trainformer.config import ModelConfig, load_config
from trainformer.model.heads import Classifier, ClassifierHead, MaskedLM, build_classifier, build_masked_lm
from trainformer.model.layers import gelu, gelu_exact, squared_relu
from test_layers import run_layer_test  # the shared layer-test helper (tests/model/test_layers.py)

VOCAB, MAX_LEN, D = 200, 16, 32
TINY = ModelConfig(d_model=D, num_layers=2, num_heads=2, dff=64, dropout=0.1)


def block_params(d, dff):
    return (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * dff + dff) + (dff * d + d) + 2 * d


def make_inputs(batch=3, seq=MAX_LEN, predictions=4, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB // 2, (batch, seq)).astype("int32")  # ids >= VOCAB/2 never occur
    ids[-1, seq - 5:] = 0  # one padded row
    positions = np.stack([rng.choice(seq - 5, predictions, replace=False) for _ in range(batch)]).astype("int32")
    return {"token_ids": ids, "padding_mask": ids != 0, "masked_positions": positions}


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return build_masked_lm(TINY, VOCAB, MAX_LEN)


def test_output_shape_and_dtype(model):
    inputs = make_inputs(batch=3, predictions=4)
    logits = model(inputs, training=False)
    assert tuple(logits.shape) == (3, 4, VOCAB)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(np.asarray(logits)))
    assert isinstance(model, MaskedLM)


def test_only_masked_positions_are_scored(model):
    inputs = make_inputs()
    logits = np.asarray(model(inputs, training=False))
    flipped = dict(inputs, masked_positions=inputs["masked_positions"][:, ::-1].copy())
    np.testing.assert_allclose(np.asarray(model(flipped, training=False)), logits[:, ::-1], atol=1e-6)
    one = dict(inputs, masked_positions=inputs["masked_positions"][:, 2:3].copy())
    np.testing.assert_allclose(np.asarray(model(one, training=False))[:, 0], logits[:, 2], atol=1e-5)


def test_head_math(model):
    """logits = LayerNorm(gelu(h W + b)) E^T + bias, at the masked positions only."""
    inputs = make_inputs(seed=3)
    sequence = np.asarray(model.encoder({k: inputs[k] for k in ("token_ids", "padding_mask")}, training=False))
    head = model.get_layer("mlm_head")
    head.output_bias.assign(np.random.default_rng(4).normal(size=VOCAB).astype("float32"))
    kernel, bias = (np.asarray(w) for w in head._transform.weights)
    gamma, beta = (np.asarray(w) for w in head._norm.weights)
    gathered = np.take_along_axis(sequence, inputs["masked_positions"][..., None], axis=1)
    hidden = np.asarray(keras.activations.gelu(gathered @ kernel + bias, approximate=True))
    mean, var = hidden.mean(-1, keepdims=True), hidden.var(-1, keepdims=True)
    hidden = (hidden - mean) / np.sqrt(var + 1e-12) * gamma + beta
    expected = hidden @ np.asarray(model.encoder.token_embedding.embeddings).T + np.asarray(head.output_bias)
    try:
        np.testing.assert_allclose(np.asarray(model(inputs, training=False)), expected, rtol=1e-4, atol=1e-5)
    finally:
        head.output_bias.assign(np.zeros(VOCAB, "float32"))


def test_output_weights_are_tied_to_the_embedding(model):
    encoder = model.encoder
    head_own = (D * D + D) + 2 * D + VOCAB  # transform + LayerNorm + output bias
    assert model.count_params() == encoder.count_params() + head_own
    assert encoder.count_params() == VOCAB * D + 2 * D + 2 * block_params(D, 64)  # sinusoidal, post-norm
    assert sum(tuple(w.shape) in ((VOCAB, D), (D, VOCAB)) for w in model.weights) == 1
    assert model.get_layer("mlm_head").token_embedding is encoder.token_embedding


def test_changing_the_embedding_row_changes_only_that_logit(model):
    inputs = make_inputs()
    before = np.asarray(model(inputs, training=False))
    embedding = model.encoder.token_embedding.embeddings
    saved = np.asarray(embedding)
    unused = VOCAB - 1  # never an input id, so the encoder output cannot change
    try:
        changed = saved.copy()
        changed[unused] += np.random.default_rng(2).normal(size=D)  # (not a constant: h sums to ~0 after LayerNorm)
        embedding.assign(changed)
        after = np.asarray(model(inputs, training=False))
    finally:
        embedding.assign(saved)
    assert np.abs(after[..., unused] - before[..., unused]).min() > 1e-3
    np.testing.assert_allclose(np.delete(after, unused, -1), np.delete(before, unused, -1), atol=1e-6)


def test_keras_file_round_trip(model, tmp_path):
    inputs = make_inputs(seed=1)
    expected = np.asarray(model(inputs, training=False))
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, MaskedLM)
    assert loaded.count_params() == model.count_params()
    np.testing.assert_array_equal(np.asarray(loaded(inputs, training=False)), expected)
    # the reloaded head is still tied to the reloaded embedding
    assert loaded.get_layer("mlm_head").token_embedding is loaded.encoder.token_embedding


@pytest.mark.parametrize("norm, position", [("pre", "learned"), ("post", "learned"), ("pre", "sinusoidal")])
def test_other_variants_build_and_run(norm, position):
    config = ModelConfig(d_model=D, num_layers=1, num_heads=2, dff=64, norm=norm, position=position)
    model = build_masked_lm(config, VOCAB, MAX_LEN)
    names = {layer.name for layer in model.encoder.layers}
    assert ("final_norm" in names) == (norm == "pre")
    assert ("embeddings_norm" in names) == (norm == "post")
    extra = MAX_LEN * D if position == "learned" else 0
    assert model.encoder.count_params() == VOCAB * D + 2 * D + block_params(D, 64) + extra
    assert tuple(model(make_inputs(), training=False).shape) == (3, 4, VOCAB)


def test_mixed_bfloat16_still_gives_float32_logits():
    model = build_masked_lm(TINY, VOCAB, MAX_LEN, dtype="mixed_bfloat16")
    logits = model(make_inputs(), training=False)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(np.asarray(logits)))
    assert all(w.dtype == "float32" for w in model.weights)  # variables stay float32
    assert model.encoder.get_layer("block_0").compute_dtype == "bfloat16"


def gathered_tables(model, inputs):
    """The dtype of every (VOCAB, D) table a traced forward pass gathers rows from."""
    import tensorflow as tf

    graph = tf.function(lambda x: model(x, training=True)).get_concrete_function(inputs).graph
    return [op.inputs[0].dtype.name for op in graph.get_operations()
            if op.type == "GatherV2" and op.inputs[0].shape.as_list() == [VOCAB, D]]


def test_mixed_bfloat16_gathers_from_the_float32_table_and_runs_the_head_in_bfloat16():
    """The encoder keeps the policy it is given. A functional model drops its dtype argument:
    then the token embedding autocast its whole table to bf16 before the gather (its gradient a
    bf16 scatter-add, GPUs' slow path), and the head, built with the encoder's policy, ran in
    float32."""
    model = build_masked_lm(TINY, VOCAB, MAX_LEN, dtype="mixed_bfloat16")
    assert model.encoder.dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("mlm_head").compute_dtype == "bfloat16"
    assert gathered_tables(model, make_inputs()) == ["float32"]
    float32 = build_masked_lm(TINY, VOCAB, MAX_LEN)
    assert float32.encoder.dtype_policy.name == "float32"
    assert type(model.encoder).from_config(model.encoder.get_config()).dtype_policy.name == "mixed_bfloat16"


def test_zh_bert_80m_parameters_follow_the_formula():  # ~80M on its own data: tests/test_config_sizes.py
    config = load_config("zh-bert-80m")
    model = build_masked_lm(config.model, 21128, config.data.seq_len)
    m = config.model
    expected = (
        21128 * m.d_model + config.data.seq_len * m.d_model + 2 * m.d_model  # token + learned positions + LN
        + m.num_layers * block_params(m.d_model, m.dff)
        + (m.d_model * m.d_model + m.d_model) + 2 * m.d_model + 21128  # head
    )
    assert model.count_params() == expected


@pytest.mark.parametrize("activation, function", [("gelu", gelu_exact), ("gelu_tanh", gelu), ("relu2", squared_relu)])
def test_activation_reaches_every_block_and_the_head(activation, function):
    config = ModelConfig(d_model=D, num_layers=2, num_heads=2, dff=64, activation=activation)
    model = build_masked_lm(config, VOCAB, MAX_LEN)
    assert tuple(model(make_inputs(), training=False).shape) == (3, 4, VOCAB)
    head = model.get_layer("mlm_head")
    assert model.encoder.get_config()["activation"] == head.get_config()["activation"] == activation
    assert head._transform.activation is function
    for index in range(2):
        block = model.encoder.get_layer(f"block_{index}")
        assert block.activation == activation
        x = keras.random.normal((3, 4, D))
        np.testing.assert_allclose(block._feed_forward(x, training=False),
                                   block._ffn_output(function(block._ffn_inner(x))), atol=1e-6)
    revived = MaskedLM.from_config(model.get_config())  # as a .keras file rebuilds it
    assert revived.encoder.activation == revived.get_layer("mlm_head").activation == activation


# --- classification ---------------------------------------------------------------------------

def test_classifier_head_layer_contract_and_math():
    head = ClassifierHead(num_labels=3, dropout=0.1)
    sequence = np.random.default_rng(5).normal(size=(2, 7, D)).astype("float32")
    logits = run_layer_test(head, sequence, expected_shape=(2, 3))
    assert head.get_config()["num_labels"] == 3 and head.get_config()["dropout"] == 0.1
    assert [w.path for w in head.weights] == ["classifier_head/pooler/kernel", "classifier_head/pooler/bias",
                                              "classifier_head/logits/kernel", "classifier_head/logits/bias"]
    pooler_kernel, pooler_bias, kernel, bias = head.get_weights()
    expected = np.tanh(sequence[:, 0] @ pooler_kernel + pooler_bias) @ kernel + bias  # [CLS] only
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_classifier_builds_runs_and_round_trips(tmp_path):
    config = ModelConfig(d_model=D, num_layers=1, num_heads=2, dff=64, dropout=0.1, norm="post",
                         position="learned", activation="gelu")
    model = build_classifier(config, VOCAB, MAX_LEN, num_labels=4)
    inputs = {k: v for k, v in make_inputs().items() if k != "masked_positions"}
    logits = np.asarray(model(inputs, training=False))
    assert logits.shape == (3, 4) and logits.dtype == "float32"
    assert isinstance(model, Classifier) and model.head.dropout == config.dropout
    assert model.count_params() == model.encoder.count_params() + (D * D + D) + (D * 4 + 4)
    path = tmp_path / "c.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, Classifier) and loaded.encoder.activation == "gelu"
    np.testing.assert_array_equal(np.asarray(loaded(inputs, training=False)), logits)


def test_classifier_logits_are_float32_under_mixed_bfloat16():
    model = build_classifier(TINY, VOCAB, MAX_LEN, num_labels=2, dtype="mixed_bfloat16")
    logits = model({k: v for k, v in make_inputs().items() if k != "masked_positions"}, training=False)
    assert logits.dtype == "float32" and np.all(np.isfinite(np.asarray(logits)))
    assert all(w.dtype == "float32" for w in model.weights)


# --- mean pooling (model.pooling: mean) -------------------------------------------------------

def test_mean_pooling_feeds_the_pooler_the_mean_of_the_unpadded_vectors():
    head = ClassifierHead(num_labels=3, dropout=0.0, pooling="mean")
    rng = np.random.default_rng(6)
    sequence = rng.normal(size=(3, 7, D)).astype("float32")
    mask = np.arange(7)[None] < np.array([[7], [4], [1]])  # 7, 4 and 1 tokens, the rest padding
    logits = np.asarray(head(sequence, mask))
    pooler_kernel, pooler_bias, kernel, bias = head.get_weights()
    means = np.stack([row[keep].mean(axis=0) for row, keep in zip(sequence, mask)])  # numpy, over tokens only
    expected = np.tanh(means @ pooler_kernel + pooler_bias) @ kernel + bias
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    # what padding holds does not matter, only where it is
    sequence[~mask] = 1e3
    np.testing.assert_allclose(np.asarray(head(sequence, mask)), logits, rtol=1e-6, atol=1e-6)


def test_mean_pooling_head_contract():
    head = ClassifierHead(num_labels=2, dropout=0.1, pooling="mean", name="classifier_head")
    assert head.get_config()["pooling"] == "mean"
    assert ClassifierHead.from_config(head.get_config()).pooling == "mean"
    assert ClassifierHead(num_labels=2).pooling == "cls"  # BERT's, the default
    with pytest.raises(ValueError, match="pooling"):
        ClassifierHead(num_labels=2, pooling="max")
    with pytest.raises(ValueError, match="padding_mask"):
        head(np.zeros((1, 3, D), "float32"))


def test_a_mean_pooling_classifier_ignores_padding_and_round_trips(tmp_path):
    """More [PAD] columns change nothing: attention masks them out of every token's vector and
    the mean leaves them out; the .keras file keeps the pooling."""
    keras.utils.set_random_seed(3)
    config = ModelConfig(d_model=D, num_layers=1, num_heads=2, dff=64, dropout=0.0, pooling="mean")
    model = build_classifier(config, VOCAB, MAX_LEN, num_labels=3)
    ids = make_inputs(seq=10)["token_ids"]
    padded = np.pad(ids, [(0, 0), (0, MAX_LEN - 10)])  # the same texts, padded 6 positions further
    logits = np.asarray(model({"token_ids": ids, "padding_mask": ids != 0}))
    longer = np.asarray(model({"token_ids": padded, "padding_mask": padded != 0}))
    np.testing.assert_allclose(longer, logits, rtol=1e-5, atol=1e-6)
    cls = build_classifier(dataclasses.replace(config, pooling="cls"), VOCAB, MAX_LEN, num_labels=3)
    cls.set_weights(model.get_weights())  # the same weights pooled from [CLS]: another answer
    assert not np.allclose(np.asarray(cls({"token_ids": ids, "padding_mask": ids != 0})), logits, atol=1e-4)
    model.save(tmp_path / "mean.keras")
    loaded = keras.saving.load_model(tmp_path / "mean.keras")
    assert loaded.pooling == loaded.head.pooling == "mean" and model.get_config()["pooling"] == "mean"
    np.testing.assert_array_equal(np.asarray(loaded({"token_ids": ids, "padding_mask": ids != 0})), logits)
