"""The encoder-decoder and its in-graph search: the cache, greedy vs beam, the beam's promise,
serialization, a model that learns to copy, and the pointer-generator's copy distribution."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import ModelConfig
from trainformer.tokens import CLS_ID, PAD_ID, SEP_ID
from trainformer.model import search
from trainformer.model.decoder import onto_vocabulary
from trainformer.model.seq2seq import Seq2Seq, build_seq2seq

VOCAB, TARGET_LEN = 64, 12
RNG = np.random.default_rng(0)


def tiny_model(norm="pre", tie=True, position="sinusoidal", copy=False):
    keras.utils.set_random_seed(3)
    config = ModelConfig(d_model=32, num_layers=2, num_heads=2, dff=64, norm=norm, position=position,
                         tie_embeddings=tie, decoder_layers=2, copy_source=copy)
    return build_seq2seq(config, VOCAB, 16, TARGET_LEN)


def sources(batch=3, length=10):
    """The same 3 sources on every call, of 10, 7 and 4 tokens."""
    ids = np.random.default_rng(1).integers(5, VOCAB, (batch, length)).astype(np.int32)
    lengths = np.array([length, 7, 4][:batch])
    ids[np.arange(length)[None] >= lengths[:, None]] = PAD_ID
    return tf.constant(ids), tf.constant(ids != PAD_ID)


@pytest.mark.parametrize("norm, tie, position, copy", [("pre", True, "sinusoidal", False),
                                                      ("post", False, "learned", False),
                                                      ("pre", True, "sinusoidal", True),
                                                      ("pre", True, "rope", True)])  # its decoder: sinusoidal
def test_a_cached_step_equals_the_whole_prefix(norm, tie, position, copy):
    model = tiny_model(norm, tie, position, copy)
    source_ids, source_mask = sources()
    targets = tf.constant(RNG.integers(5, VOCAB, (3, TARGET_LEN)).astype(np.int32))
    full = model({"source_ids": source_ids, "source_mask": source_mask, "target_ids": targets,
                  "target_mask": targets != PAD_ID})  # (3, t, vocab): teacher forcing
    state = search.initial_state(model, source_ids, source_mask, TARGET_LEN)
    step = search.cached_step(model)
    for index in range(TARGET_LEN):
        logits, state = step(targets, index, state)
        np.testing.assert_allclose(logits.numpy(), full[:, index].numpy(), atol=2e-5)


def test_a_rotary_encoders_decoder_adds_fixed_positions():
    """The cached step turns no queries and keys, so a rope encoder's decoder adds sinusoidal
    vectors: no position table to learn from a thousand headlines, none in the encoder."""
    assert not [w.path for w in tiny_model(position="rope").weights if "position" in w.path]


def run_search(model, beam_size=None, cache=True, max_length=TARGET_LEN, alpha=0.6):
    source_ids, source_mask = sources()
    state = search.initial_state(model, source_ids, source_mask, max_length, cache)
    step = search.cached_step(model) if cache else search.uncached_step(model)
    if beam_size is None:
        return tf.function(lambda s: search.greedy_search(step, s, 3, max_length))(state)
    return tf.function(lambda s: search.beam_search(step, s, 3, max_length, beam_size, alpha))(state)


@pytest.mark.parametrize("copy", [False, True])
def test_beam_of_one_is_greedy_and_the_cache_changes_nothing(copy):
    model = tiny_model(copy=copy)
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
    """The decoder is built with the encoder's policy: a bf16 run decodes in bf16, not float32;
    the copy mixes its distributions in float32 (bf16 would round the logits to 3 digits)."""
    model = build_seq2seq(ModelConfig(d_model=16, num_layers=1, num_heads=2, dff=32, copy_source=True), VOCAB,
                          16, TARGET_LEN, dtype="mixed_bfloat16")
    assert model.get_layer("decoder").compute_dtype == "bfloat16"
    assert model.get_layer("decoder").blocks[0].compute_dtype == "bfloat16"
    source_ids, source_mask = sources()
    log_probs = model({"source_ids": source_ids, "source_mask": source_mask, "target_ids": source_ids,
                       "target_mask": source_mask})
    assert log_probs.dtype == "float32"
    np.testing.assert_allclose(tf.reduce_logsumexp(log_probs, axis=-1).numpy(), 0.0, atol=1e-5)


def test_seq2seq_round_trips_through_keras_serialization():
    model = tiny_model(tie=False, copy=True)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert isinstance(clone, Seq2Seq) and not clone.tie_embeddings and clone.copy_source
    clone.set_weights(model.get_weights())
    source_ids, source_mask = sources()
    inputs = {"source_ids": source_ids, "source_mask": source_mask, "target_ids": source_ids,
              "target_mask": source_mask}
    np.testing.assert_array_equal(clone(inputs).numpy(), model(inputs).numpy())
    # the decoder's own embedding; the copy's query, key and gate (kernel and bias each)
    assert len(model.weights) - len(tiny_model(tie=True).weights) == 1 + 6


def copy_outputs(gate_bias: float):
    """A copy model's log-probabilities with its gate's bias set (weights 0): -30 copies only,
    +30 generates only. Returns (log p (3, t, vocab), the same model's logits without the copy)."""
    model = tiny_model(copy=True)
    gate = model.get_layer("decoder")._copy._gate
    gate.kernel.assign(tf.zeros_like(gate.kernel))
    gate.bias.assign(tf.fill(gate.bias.shape, gate_bias))
    plain = tiny_model()
    weights = {w.path: w for w in model.weights}
    for weight in plain.weights:
        weight.assign(weights[weight.path])
    source_ids, source_mask = sources()
    inputs = {"source_ids": source_ids, "source_mask": source_mask, "target_ids": source_ids[:, :TARGET_LEN],
              "target_mask": source_mask[:, :TARGET_LEN]}
    return model(inputs).numpy(), plain(inputs).numpy()


def test_the_copy_puts_its_mass_on_the_source_tokens_and_the_gate_mixes_it_in():
    """With the gate shut, each row's probability sits on the ids its real source tokens hold
    (padding gets none); open, the output is the plain decoder's log-softmax; either way a
    distribution (log-sum-exp 0), which log_softmax leaves as it is for the loss and search."""
    copied, _ = copy_outputs(-30.0)
    source_ids, source_mask = (tensor.numpy() for tensor in sources())
    np.testing.assert_allclose(tf.reduce_logsumexp(copied, axis=-1).numpy(), 0.0, atol=1e-5)
    for row in range(3):
        held = np.unique(source_ids[row][source_mask[row]])
        probs = np.exp(copied[row])  # (t, vocab)
        np.testing.assert_allclose(probs[:, held].sum(axis=-1), 1.0, atol=1e-5)
        assert probs[:, PAD_ID].max() < 1e-6
    generated, logits = copy_outputs(30.0)
    np.testing.assert_allclose(generated, tf.nn.log_softmax(logits).numpy(), atol=1e-5)


def test_the_copy_weights_add_up_on_a_token_the_source_repeats():
    """onto_vocabulary's scatter-add equals the one-hot product it replaced: a token held at
    two source positions gets both weights, a token held nowhere gets 0."""
    weights = tf.constant(np.random.default_rng(0).random((2, 3, 4)), tf.float32)  # (batch, t, s)
    ids = tf.constant([[5, 7, 5, 5], [1, 2, 3, 4]], tf.int32)  # (batch, s)
    summed = onto_vocabulary(weights, ids, 9).numpy()  # (batch, t, vocab)
    np.testing.assert_allclose(summed, tf.einsum("bts,bsv->btv", weights, tf.one_hot(ids, 9)).numpy(), atol=1e-6)
    np.testing.assert_allclose(summed[0, :, 5], weights.numpy()[0, :, [0, 2, 3]].sum(axis=0), atol=1e-6)
    assert summed[0, :, 6].max() == 0.0


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


@pytest.mark.parametrize("tie, copy", [(True, False), (False, True)])
def test_a_checkpoint_holds_every_weight(tmp_path, tie, copy):
    """TF checkpoints see only attributes: a decoder keeping its blocks in a list saved 18 of 38
    weights, and eval then ran a half-random model."""
    model = tiny_model(tie=tie, copy=copy)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == len(model.trainable_variables)
    keras.utils.set_random_seed(9)
    restored = build_seq2seq(ModelConfig(d_model=32, num_layers=2, num_heads=2, dff=64, norm="pre",
                                         tie_embeddings=tie, decoder_layers=2, copy_source=copy), VOCAB, 16,
                                         TARGET_LEN)
    tf.train.Checkpoint(model=restored).restore(path).assert_existing_objects_matched()
    for ours, theirs in zip(restored.weights, model.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
