"""classify_pipeline's training stream with data.input_mask_rate: which tokens it hides, and
that batch n stays a pure function of (seed, n), so a resumed run reads the same batches; with
teachers' probabilities, that each row gets its own text's; under R-Drop, that each text comes
twice side by side and the loss compares the pair's predictions."""

import numpy as np
import tensorflow as tf

from trainformer.config import load_config
from trainformer.data.classify_pipeline import eval_batches, train_dataset
from trainformer.tasks.classify import ClassifyTask, classify_sums, rdrop_sums
from trainformer.tokens import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID

RATE = 0.3


def framed_examples(count=64, seed=0, longest=42) -> dict[str, np.ndarray]:
    """`[CLS] ids [SEP]` texts of 5..longest tokens, as classify_pipeline.encode returns them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, longest + 1, size=count).astype(np.int32)
    texts = [np.concatenate([[CLS_ID], rng.integers(NUM_SPECIAL, 500, size=n - 2), [SEP_ID]]) for n in lengths]
    return {"flat": np.concatenate(texts).astype(np.int32), "lengths": lengths,
            "labels": rng.integers(0, 2, size=count).astype(np.int32)}


def first_batches(examples, rate, start=0, count=6):
    stream = train_dataset(examples, 8, seed=5, seq_len=32, start_batch=start, mask_rate=rate).take(count)
    return [(inputs["token_ids"].numpy(), targets["labels"].numpy()) for inputs, targets in stream]


def test_hidden_tokens_are_text_tokens_at_the_rate_and_nothing_else_changes():
    examples = framed_examples()
    plain, hidden = first_batches(examples, 0.0), first_batches(examples, RATE)
    replaced = total = 0
    for (ids, labels), (masked, masked_labels) in zip(plain, hidden):
        np.testing.assert_array_equal(labels, masked_labels)
        changed = ids != masked
        assert np.all(masked[changed] == MASK_ID) and np.all(ids[changed] >= NUM_SPECIAL)  # never [CLS], [SEP], pad
        assert not np.any(ids == MASK_ID)
        replaced += changed.sum()
        total += np.sum(ids >= NUM_SPECIAL)
        assert np.all((masked == PAD_ID) == (ids == PAD_ID))
    assert abs(replaced / total - RATE) < 0.05  # ~1,000 text tokens: the share is within a few points


def test_each_batch_hides_other_positions():
    """A fresh draw per batch (a seed per batch number), not one pattern reused: texts of one
    length make every batch the same shape, so the patterns can be compared."""
    examples = framed_examples(longest=5)
    patterns = [ids == MASK_ID for ids, _ in first_batches(examples, RATE)]
    assert all(not np.array_equal(patterns[0], other) for other in patterns[1:])


def test_a_stream_started_at_batch_n_hides_what_the_whole_stream_hid_there():
    examples = framed_examples()
    whole, resumed = first_batches(examples, RATE), first_batches(examples, RATE, start=3, count=3)
    for (ids, labels), (again, again_labels) in zip(whole[3:], resumed):
        np.testing.assert_array_equal(ids, again)
        np.testing.assert_array_equal(labels, again_labels)


def test_eval_batches_read_whole_texts():
    examples = framed_examples()
    ids = np.concatenate([inputs["token_ids"].numpy().ravel() for inputs, _ in eval_batches(examples, 8, 32)])
    assert not np.any(ids == MASK_ID)


def test_each_row_carries_the_teachers_probabilities_of_its_own_text():
    """Soft targets that name their text: a row's first probability is its length / 100, so a
    gather that took another row's (the stream shuffles and sorts by length) would show."""
    examples = framed_examples()
    first = examples["lengths"] / 100
    examples["soft"] = np.stack([first, 1 - first], axis=1).astype(np.float32)  # (examples, 2)
    stream = train_dataset(examples, 8, seed=5, seq_len=64).take(6)
    for inputs, targets in stream:
        lengths = np.sum(inputs["token_ids"].numpy() != PAD_ID, axis=1)
        np.testing.assert_allclose(targets["soft"].numpy()[:, 0], lengths / 100, rtol=1e-6)


def test_the_loss_is_the_cross_entropy_against_the_soft_targets_when_there_are_some():
    logits = tf.constant([[2.0, -1.0], [0.5, 0.0], [-1.0, 1.0]])
    labels = tf.constant([0, 1, 1])
    soft = tf.constant([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]])
    log_p = tf.nn.log_softmax(logits).numpy()
    taught = classify_sums(logits, {"labels": labels, "soft": soft})
    np.testing.assert_allclose(float(taught["loss_sum"]), -np.sum(soft.numpy() * log_p), rtol=1e-6)
    hard = classify_sums(logits, {"labels": labels})
    np.testing.assert_allclose(float(hard["loss_sum"]), -sum(log_p[i, label] for i, label in enumerate([0, 1, 1])),
                               rtol=1e-6)
    assert float(taught["correct"]) == float(hard["correct"]) == 2  # accuracy counts the labels either way


def test_label_smoothing_moves_that_share_of_each_target_onto_every_label_in_training_only():
    logits = tf.constant([[2.0, -1.0, 0.0], [0.5, 0.0, 1.0]])
    targets = {"labels": tf.constant([0, 2])}
    log_p = tf.nn.log_softmax(logits).numpy()
    smoothed = np.array([[0.8, 0.0, 0.0], [0.0, 0.0, 0.8]]) + 0.2 / 3  # (1 - 0.2) one-hot + 0.2 / 3 labels
    np.testing.assert_allclose(float(classify_sums(logits, targets, 0.2)["loss_sum"]), -np.sum(smoothed * log_p),
                               rtol=1e-6)
    config = load_config(None, ["task.type=classify", "train.label_smoothing=0.2"])
    trained = float(ClassifyTask(config).loss_sums(logits, targets)["loss_sum"])
    np.testing.assert_allclose(trained, -np.sum(smoothed * log_p), rtol=1e-6)  # the task trains on it
    assert trained > float(classify_sums(logits, targets)["loss_sum"])  # eval's loss (the labels as they are)


def test_under_rdrop_each_text_comes_twice_side_by_side_in_the_batch_it_came_in_once():
    examples = framed_examples()
    once = train_dataset(examples, 8, seed=5, seq_len=64).take(4)
    twice = train_dataset(examples, 8, seed=5, seq_len=64, twice=True).take(4)
    for (inputs, targets), (paired, paired_targets) in zip(once, twice):
        ids, doubled = inputs["token_ids"].numpy(), paired["token_ids"].numpy()  # (8, L), (16, L)
        np.testing.assert_array_equal(doubled[0::2], ids)
        np.testing.assert_array_equal(doubled[1::2], ids)
        np.testing.assert_array_equal(paired_targets["labels"].numpy()[1::2], targets["labels"].numpy())
        assert paired_targets["paired"].shape == [16] and "paired" not in targets


def test_the_rdrop_loss_adds_the_symmetric_kl_of_each_pair_and_leaves_eval_batches_alone():
    logits = tf.constant([[2.0, -1.0], [0.5, 0.0], [-1.0, 1.0], [-1.0, 1.0]])  # two texts, two draws each
    targets = {"labels": tf.constant([0, 0, 1, 1])}
    plain = classify_sums(logits, targets)
    p = tf.nn.softmax(logits).numpy()
    kl = np.sum(p[0] * np.log(p[0] / p[1])) + np.sum(p[1] * np.log(p[1] / p[0]))  # the second pair agrees: 0
    paired = rdrop_sums(logits, {**targets, "paired": tf.ones([4], tf.bool)}, weight=3.0)
    np.testing.assert_allclose(float(paired["loss_sum"]), float(plain["loss_sum"]) + 3.0 / 2 * kl, rtol=1e-6)
    assert kl > 0.1 and float(paired["correct"]) == float(plain["correct"])
    eval_batch = rdrop_sums(logits[:3], {"labels": targets["labels"][:3]}, weight=3.0)  # no pairs, odd rows
    assert float(eval_batch["loss_sum"]) == float(classify_sums(logits[:3], {"labels": targets["labels"][:3]})["loss_sum"])


def test_train_rdrop_gives_the_task_paired_batches_and_the_paired_loss():
    config = load_config(None, ["task.type=classify", "train.rdrop=2", "model.dropout=0.1", "data.seq_len=64",
                                "train.batch_size=8"])
    task = ClassifyTask(config)
    task.examples = {"train": framed_examples()}  # what prepare() would encode
    inputs, targets = next(iter(task.train_batches(0)))
    assert inputs["token_ids"].shape[0] == 16 and "paired" in targets  # 8 texts, two rows each
    logits = tf.random.stateless_normal([16, 2], seed=[1, 2])
    paired = float(task.loss_sums(logits, targets)["loss_sum"])
    np.testing.assert_allclose(paired, float(rdrop_sums(logits, targets, 2.0)["loss_sum"]))
    assert paired > float(classify_sums(logits, targets)["loss_sum"])
