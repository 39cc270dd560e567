"""The encoder-decoder and its in-graph search: the cache, greedy vs beam, the beam's promise,
serialization, and a model that learns to copy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import ModelConfig
from trainformer.tokens import CLS_ID, PAD_ID, SEP_ID
from trainformer.model import search
from trainformer.model.seq2seq import Seq2Seq, build_seq2seq

VOCAB, TARGET_LEN = 64, 12
RNG = np.random.default_rng(0)


def tiny_model(norm="pre", tie=True, position="sinusoidal"):
    keras.utils.set_random_seed(3)
    config = ModelConfig(d_model=32, num_layers=2, num_heads=2, dff=64, norm=norm, position=position,
                         tie_embeddings=tie, decoder_layers=2)
    return build_seq2seq(config, VOCAB, 16, TARGET_LEN)


def sources(batch=3, length=10):
    """The same 3 sources on every call, of 10, 7 and 4 tokens."""
    ids = np.random.default_rng(1).integers(5, VOCAB, (batch, length)).astype(np.int32)
    lengths = np.array([length, 7, 4][:batch])
    ids[np.arange(length)[None] >= lengths[:, None]] = PAD_ID
    return tf.constant(ids), tf.constant(ids != PAD_ID)


@pytest.mark.parametrize("norm, tie, position", [("pre", True, "sinusoidal"), ("post", False, "learned")])
def test_a_cached_step_equals_the_whole_prefix(norm, tie, position):
    model = tiny_model(norm, tie, position)
    source_ids, source_mask = sources()
    targets = tf.constant(RNG.integers(5, VOCAB, (3, TARGET_LEN)).astype(np.int32))
    full = model({"source_ids": source_ids, "source_mask": source_mask, "target_ids": targets,
                  "target_mask": targets != PAD_ID})  # (3, t, vocab): teacher forcing
    state = search.initial_state(model, source_ids, source_mask, TARGET_LEN)
    step = search.cached_step(model)
    for index in range(TARGET_LEN):
        logits, state = step(targets, index, state)
        np.testing.assert_allclose(logits.numpy(), full[:, index].numpy(), atol=2e-5)


def run_search(model, beam_size=None, cache=True, max_length=TARGET_LEN, alpha=0.6):
    source_ids, source_mask = sources()
    state = search.initial_state(model, source_ids, source_mask, max_length, cache)
    step = search.cached_step(model) if cache else search.uncached_step(model)
    if beam_size is None:
        return tf.function(lambda s: search.greedy_search(step, s, 3, max_length))(state)
    return tf.function(lambda s: search.beam_search(step, s, 3, max_length, beam_size, alpha))(state)


def test_beam_of_one_is_greedy_and_the_cache_changes_nothing():
    model = tiny_model()
    greedy, greedy_log_probs = run_search(model)
    beam, scores, _ = run_search(model, beam_size=1, alpha=0.0)  # alpha 0: scores are log-probabilities
    np.testing.assert_array_equal(beam[:, 0].numpy(), greedy.numpy())
    np.testing.assert_allclose(scores[:, 0].numpy(), greedy_log_probs.numpy(), rtol=1e-5)
    for beam_size in (None, 4):
        cached, uncached = run_search(model, beam_size), run_search(model, beam_size, cache=False)
        np.testing.assert_array_equal(cached[0].numpy(), uncached[0].numpy())


def teacher_forced_log_prob(model, source_ids, source_mask, output):
    """log p(output) by the model, output (t,) ending at its [SEP] (or cut at max length)."""
    end = list(output).index(SEP_ID) + 1 if SEP_ID in output else len(output)
    output = np.asarray(output[:end], np.int32)
    target_ids = tf.constant(np.concatenate([[CLS_ID], output[:-1]])[None], tf.int32)
    logits = model({"source_ids": source_ids, "source_mask": source_mask, "target_ids": target_ids,
                    "target_mask": target_ids != PAD_ID})
    log_probs = tf.nn.log_softmax(logits[0]).numpy()
    return float(log_probs[np.arange(end), output].sum()), end


def test_beam_scores_are_the_models_and_no_dropped_hypothesis_beats_a_returned_one():
    model = tiny_model()
    tokens, scores, dropped = run_search(model, beam_size=4)
    tokens, scores, dropped = tokens.numpy(), scores.numpy(), dropped.numpy()
    assert (np.diff(scores, axis=1) <= 0).all()  # best first
    assert (dropped <= scores[:, -1] + 1e-6).all()  # the k-th kept beats everything dropped
    source_ids, source_mask = sources()
    for beam in range(4):  # each returned score is log p / GNMT penalty of its own output
        log_prob, length = teacher_forced_log_prob(model, source_ids[:1], source_mask[:1], tokens[0, beam])
        penalty = ((5 + length) / 6) ** 0.6
        np.testing.assert_allclose(scores[0, beam], log_prob / penalty, rtol=1e-4)


def test_mixed_bfloat16_reaches_the_decoder():
    """The decoder is built with the encoder's policy: a bf16 run decodes in bf16, not float32."""
    model = build_seq2seq(ModelConfig(d_model=16, num_layers=1, num_heads=2, dff=32), VOCAB, 16,
                          TARGET_LEN, dtype="mixed_bfloat16")
    assert model.get_layer("decoder").compute_dtype == "bfloat16"
    assert model.get_layer("decoder").blocks[0].compute_dtype == "bfloat16"


def test_seq2seq_round_trips_through_keras_serialization():
    model = tiny_model(tie=False)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert isinstance(clone, Seq2Seq) and not clone.tie_embeddings
    clone.set_weights(model.get_weights())
    source_ids, source_mask = sources()
    inputs = {"source_ids": source_ids, "source_mask": source_mask, "target_ids": source_ids,
              "target_mask": source_mask}
    np.testing.assert_array_equal(clone(inputs).numpy(), model(inputs).numpy())
    assert len(model.weights) - len(tiny_model(tie=True).weights) == 1  # the decoder's own embedding


def test_the_model_learns_to_copy_a_handful_of_pairs():
    """Teacher forcing on 8 pairs: greedy decoding then reproduces every target exactly."""
    keras.utils.set_random_seed(0)
    model = build_seq2seq(ModelConfig(d_model=64, num_layers=1, num_heads=2, dff=128, norm="pre"), VOCAB, 16, 10)
    pieces = [RNG.integers(5, VOCAB, RNG.integers(3, 8)).astype(np.int32) for _ in range(8)]
    width = 9
    source_ids = np.zeros([8, width], np.int32)
    target_ids, labels = np.zeros([8, width], np.int32), np.zeros([8, width], np.int32)
    for row, ids in enumerate(pieces):
        source_ids[row, : len(ids) + 2] = [CLS_ID, *ids, SEP_ID]
        target_ids[row, : len(ids) + 1] = [CLS_ID, *ids]
        labels[row, : len(ids) + 1] = [*ids, SEP_ID]
    inputs = {"source_ids": source_ids, "source_mask": source_ids != PAD_ID, "target_ids": target_ids,
              "target_mask": target_ids != PAD_ID}
    optimizer = keras.optimizers.Adam(3e-3)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.reduce_sum(losses * tf.cast(labels != PAD_ID, tf.float32)) / np.sum(labels != PAD_ID)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for _ in range(300):
        loss = train_step()
    assert float(loss) < 0.05
    state = search.initial_state(model, tf.constant(source_ids), tf.constant(source_ids != PAD_ID), 9)
    output, _ = search.greedy_search(search.cached_step(model), state, 8, 9)
    for row, ids in enumerate(pieces):
        assert list(output[row, : len(ids) + 1].numpy()) == [*ids, SEP_ID]


@pytest.mark.parametrize("tie", [True, False])
def test_a_checkpoint_holds_every_weight(tmp_path, tie):
    """TF checkpoints see only attributes: a decoder keeping its blocks in a list saved 18 of 38
    weights, and eval then ran a half-random model."""
    model = tiny_model(tie=tie)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == len(model.trainable_variables)
    keras.utils.set_random_seed(9)
    restored = build_seq2seq(ModelConfig(d_model=32, num_layers=2, num_heads=2, dff=64, norm="pre",
                                         tie_embeddings=tie, decoder_layers=2), VOCAB, 16, TARGET_LEN)
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    for ours, theirs in zip(restored.weights, model.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
