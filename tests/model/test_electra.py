"""ELECTRA (model/electra.py, tasks/electra.py): the generator's samples, the replaced-token
labels, the loss, and that the discriminator is what a fine-tune starts from."""

import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import ModelConfig
from trainformer.model.electra import NUM_SPECIAL, Electra, ReplaceMasked, sample_tokens
from trainformer.model.heads import build_classifier, build_encoder
from trainformer.tasks.electra import ElectraTask, electra_sums
from trainformer.tokens import CLS_ID, MASK_ID, PAD_ID, SEP_ID

VOCAB = 40


def one_hot_logits(ids, vocab=VOCAB):
    """Logits (batch, P, vocab) that put all probability on ids (batch, P)."""
    return np.where(np.eye(vocab)[np.array(ids)] > 0, 30.0, -30.0).astype(np.float32)


def test_sampling_follows_the_uniform_through_the_cumulative_distribution_and_skips_special_tokens():
    # Uniform over the vocabulary: the special ids get no mass, the others 1/(VOCAB - NUM_SPECIAL) each.
    uniform = np.array([[0.0, 0.26, 0.5, 0.999]], np.float32)
    sampled = sample_tokens(tf.zeros([1, 4, VOCAB]), tf.constant(uniform)).numpy()
    expected = NUM_SPECIAL + np.floor(uniform * (VOCAB - NUM_SPECIAL)).astype(int)
    np.testing.assert_array_equal(sampled, expected)
    # A peaked distribution gives its peak whatever the uniform; a special id is never drawn.
    assert sample_tokens(tf.constant(one_hot_logits([[17, 17]])), tf.constant([[0.01, 0.99]])).numpy().tolist() \
        == [[17, 17]]
    assert sample_tokens(tf.constant(one_hot_logits([[MASK_ID]])), tf.constant([[0.5]])).numpy().min() >= NUM_SPECIAL


def test_replaced_tokens_are_labelled_where_the_sample_differs_from_the_original():
    original = np.array([[CLS_ID, 10, 11, 12, 13, SEP_ID, PAD_ID]], np.int32)
    inputs = original.copy()
    inputs[0, [1, 3, 4]] = MASK_ID  # three masked positions, their originals 10, 12, 13
    positions = np.array([[1, 3, 4, 0]], np.int32)  # the last slot is padding (position 0)
    masked_ids = np.array([[10, 12, 13, CLS_ID]], np.int32)
    # The generator proposes 10 (the original: not a replacement), 20 and 21; the padding slot 22.
    logits = one_hot_logits([[10, 20, 21, 22]])
    corrupted, replaced = ReplaceMasked()(tf.constant(inputs), tf.constant(positions), tf.constant(masked_ids),
                                         tf.constant(logits), tf.fill([1, 4], 0.5))
    np.testing.assert_array_equal(corrupted.numpy(), [[CLS_ID, 10, 11, 20, 21, SEP_ID, PAD_ID]])
    np.testing.assert_array_equal(replaced.numpy(), [[0, 0, 0, 1, 1, 0, 0]])


def test_the_loss_is_the_generators_plus_the_weighted_mean_detection_loss():
    rng = np.random.default_rng(0)
    generator_logits = rng.normal(size=[2, 3, VOCAB]).astype(np.float32)
    masked_ids = rng.integers(NUM_SPECIAL, VOCAB, size=[2, 3]).astype(np.int32)
    masked_weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)  # 3 masked tokens
    padding_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)  # 8 real tokens
    detection_logits = rng.normal(size=[2, 5]).astype(np.float32)
    replaced = np.array([[0, 1, 0, 1, 0], [0, 1, 0, 1, 1]], np.float32)  # the padded 1s must not count
    sums = electra_sums({"generator_logits": tf.constant(generator_logits),
                         "discriminator_logits": tf.constant(detection_logits), "replaced": tf.constant(replaced)},
                        {"masked_ids": tf.constant(masked_ids), "masked_weights": tf.constant(masked_weights),
                         "padding_mask": tf.constant(padding_mask)}, weight=50.0)

    log_probs = generator_logits - np.log(np.exp(generator_logits).sum(-1, keepdims=True))
    generator = -(np.take_along_axis(log_probs, masked_ids[..., None], -1)[..., 0] * masked_weights).sum() / 3
    p = 1 / (1 + np.exp(-detection_logits))
    binary = -(replaced * np.log(p) + (1 - replaced) * np.log(1 - p))
    detection = (binary * padding_mask).sum() / 8
    assert float(sums["count"]) == 3 and float(sums["tokens"]) == 8 and float(sums["replaced"]) == 3
    np.testing.assert_allclose(float(sums["loss_sum"]) / 3, generator + 50 * detection, rtol=1e-5)
    hits = ((detection_logits > 0) == (replaced > 0)) & padding_mask
    assert float(sums["detection_correct"]) == hits.sum()


def test_the_result_warns_when_the_discriminator_barely_beats_answering_original():
    final = {"detection_accuracy": 0.7736, "detection_baseline": 0.7668, "detection_loss": 0.5,
             "masked_accuracy": 0.34, "baseline_accuracy": 0.05, "num_targets": 1000}
    assert "warning: the discriminator" in ElectraTask.result_lines(final)[-1]
    learned = {**final, "detection_accuracy": 0.90}
    assert not any("warning" in line for line in ElectraTask.result_lines(learned))


@pytest.fixture(scope="module")
def electra(tokenizer):
    config = ModelConfig(d_model=32, num_layers=2, num_heads=2, dff=64)
    return Electra(build_encoder(config, tokenizer.vocab_size, 32), generator_layers=1), config


def test_electra_on_real_windows_labels_exactly_the_changed_tokens(electra, corpus, tokenizer):
    from trainformer.data.pipeline import ELECTRA_KEYS, pack, tokenize_documents, train_dataset

    model, _ = electra
    windows = pack(tokenize_documents(tokenizer, corpus.train[:200]), 32)
    inputs, targets = next(iter(train_dataset(windows, 8, seed=3, mask_rate=0.15, vocab_size=tokenizer.vocab_size,
                                              keys=ELECTRA_KEYS)))
    outputs = model(inputs, training=True)
    original = inputs["token_ids"].numpy().copy()
    positions, weights = inputs["masked_positions"].numpy(), targets["masked_weights"].numpy()
    rows = np.arange(len(original))[:, None]
    original[rows, positions] = np.where(weights > 0, inputs["masked_ids"].numpy(), original[rows, positions])
    sampled = sample_tokens(outputs["generator_logits"], inputs["sample_uniform"]).numpy()
    corrupted = original.copy()
    corrupted[rows, positions] = np.where(weights > 0, sampled, corrupted[rows, positions])
    np.testing.assert_array_equal(outputs["replaced"].numpy(), (corrupted != original).astype(np.float32))
    assert outputs["replaced"].numpy().sum() > 0  # an untrained generator replaces most masked tokens
    assert outputs["discriminator_logits"].shape == original.shape


def test_the_generator_takes_the_discriminators_rotary_positions(tokenizer):
    """The generator shares the token embedding, so it must place tokens as the encoder does:
    with RoPE, no position vectors and queries and keys rotated in every block."""
    config = ModelConfig(d_model=32, num_layers=2, num_heads=2, dff=64, position="rope")
    model = Electra(build_encoder(config, tokenizer.vocab_size, 32), generator_layers=1)
    assert not [w for w in model.weights if "position" in w.path]
    assert model.get_layer("generator_block_0").rotary and model.encoder.get_layer("block_0").rotary


def test_a_classifier_starts_from_the_discriminator(electra, tmp_path, tokenizer):
    from trainformer.train.checkpoint import restore_pretrained

    model, config = electra
    tf.train.Checkpoint(model=model).save(tmp_path / "ckpt")
    classifier = build_classifier(config, tokenizer.vocab_size, 32, num_labels=2)
    restore_pretrained(classifier, tmp_path)
    for ours, theirs in zip(classifier.encoder.weights, model.encoder.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
