"""The seq2seq input pipeline on real People's Daily pairs (each paragraph's first half -> its
second half): [CLS]/[SEP] framing and shift, token-budget batches, the resume contract, eval
batches that put every pair back in place, the pair cache, and distribute() on batches whose
row count varies."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from cli_helpers import ENV

from trainformer.data.seq2seq_pipeline import (
    ROW_MULTIPLE, BatchPlan, cached_encode_pairs, decoder_io, epoch_batches, eval_batches, load_cached_pairs,
    padded_widths, pairs_cache_file, train_dataset,
)
from trainformer.tokens import CLS_ID, PAD_ID, SEP_ID

SOURCE_LEN, TARGET_LEN = 96, 40  # 40: not a multiple of 16, so the cap shows
BATCH_TOKENS = 1024  # 8 rows of the longest pairs (96 + 40) exceed it: the at-least-8-rows rule shows too
SEED = 5


@pytest.fixture(scope="module")
def pairs(corpus):
    texts = corpus.train[:496]
    return [text[: len(text) // 2] for text in texts], [text[len(text) // 2 :] for text in texts]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pairs")


@pytest.fixture(scope="module")
def examples(cache_dir, tokenizer, pairs):
    arrays, cached = cached_encode_pairs(cache_dir, tokenizer, *pairs, "people-daily", "train", SOURCE_LEN, TARGET_LEN)
    assert not cached
    return arrays


@pytest.fixture(scope="module")
def rows(examples):
    """Each pair's (source ids, target pieces) as numpy rows."""
    def split(flat, lengths):
        return np.split(flat, np.cumsum(lengths)[:-1])

    return (split(examples["source_flat"], examples["source_lengths"]),
            split(examples["target_flat"], examples["target_lengths"]))


def numpy_batch(batch) -> tuple[dict, dict]:
    inputs, targets = batch[:2]
    return {k: np.asarray(v) for k, v in inputs.items()}, {k: np.asarray(v) for k, v in targets.items()}


def assert_batch_holds(batch, indices, rows):
    """The batch is exactly pairs `indices`: sources framed, [CLS] + pieces in, pieces + [SEP] out, PAD after."""
    inputs, targets = numpy_batch(batch)
    sources, pieces = rows
    for r, i in enumerate(indices):
        source, target = sources[i], pieces[i]
        padding = inputs["source_ids"].shape[1] - len(source)
        np.testing.assert_array_equal(inputs["source_ids"][r], np.pad(source, (0, padding)))
        width = inputs["target_ids"].shape[1] - len(target) - 1
        np.testing.assert_array_equal(inputs["target_ids"][r], np.pad(np.r_[CLS_ID, target], (0, width)))
        np.testing.assert_array_equal(targets["labels"][r], np.pad(np.r_[target, SEP_ID], (0, width)))


def rounded(length: int, cap: int) -> int:
    return min(-(-length // 16) * 16, cap)


# --- encoding and the cache ---------------------------------------------------------------------

def test_sources_are_framed_and_targets_cut_without_specials(examples, rows, pairs, tokenizer):
    sources, pieces = rows
    assert all(row[0] == CLS_ID and row[-1] == SEP_ID and len(row) <= SOURCE_LEN for row in sources)
    assert sum(len(row) == SOURCE_LEN for row in sources) > 10  # some sources were cut (their end dropped)
    full = tokenizer(tf.constant(pairs[1])).to_list()
    assert sum(len(ids) > TARGET_LEN - 1 for ids in full) > 10  # and some targets
    for ids, row in zip(full, pieces):
        assert row.tolist() == ids[: TARGET_LEN - 1]
    assert examples["source_lengths"].dtype == examples["target_flat"].dtype == np.int32


def test_pairs_cache_round_trip_and_key(cache_dir, tokenizer, pairs, examples):
    again, cached = cached_encode_pairs(cache_dir, tokenizer, *pairs, "people-daily", "train", SOURCE_LEN, TARGET_LEN)
    assert cached
    for name, array in examples.items():
        np.testing.assert_array_equal(again[name], array)
        assert again[name].dtype == array.dtype
    path = pairs_cache_file(cache_dir, tokenizer, "people-daily", "train", SOURCE_LEN, TARGET_LEN)
    assert load_cached_pairs(path).keys() == examples.keys()
    assert not list(cache_dir.glob("*.partial*"))
    others = [pairs_cache_file(cache_dir, tokenizer, "people-daily", "train", SOURCE_LEN, TARGET_LEN + 1),
              pairs_cache_file(cache_dir, tokenizer, "people-daily", "valid", SOURCE_LEN, TARGET_LEN),
              pairs_cache_file(cache_dir, tokenizer, "other-data", "train", SOURCE_LEN, TARGET_LEN)]
    assert len({path, *others}) == 4


def test_decoder_io_starts_with_cls_and_ends_with_sep():
    target_ids, labels = decoder_io(tf.ragged.constant([[7, 8, 9], [], [5]], tf.int32))
    assert target_ids.to_list() == [[CLS_ID, 7, 8, 9], [CLS_ID], [CLS_ID, 5]]
    assert labels.to_list() == [[7, 8, 9, SEP_ID], [SEP_ID], [5, SEP_ID]]


# --- training batches ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan(examples):
    return BatchPlan(*padded_widths(examples, SOURCE_LEN, TARGET_LEN), BATCH_TOKENS, SEED)


@pytest.fixture(scope="module")
def first_batches(examples):
    """The first 60 batches of the stream (more than one epoch), as numpy."""
    stream = train_dataset(examples, BATCH_TOKENS, SEED, SOURCE_LEN, TARGET_LEN)
    return [numpy_batch(batch) for batch in stream.take(60)]


def test_batch_shapes_masks_and_shift(examples, first_batches, plan):
    spec = train_dataset(examples, BATCH_TOKENS, SEED, SOURCE_LEN, TARGET_LEN).element_spec
    assert spec[0]["source_ids"].shape.as_list() == [None, None] and spec[1]["labels"].dtype == tf.int32
    assert plan.count(0) < len(first_batches)
    widths = set()
    for inputs, targets in first_batches:
        source_ids, target_ids, labels = inputs["source_ids"], inputs["target_ids"], targets["labels"]
        assert source_ids.dtype == target_ids.dtype == np.int32 and inputs["source_mask"].dtype == bool
        np.testing.assert_array_equal(inputs["source_mask"], source_ids != PAD_ID)
        np.testing.assert_array_equal(inputs["target_mask"], target_ids != PAD_ID)
        assert labels.shape == target_ids.shape and len(source_ids) == len(target_ids)
        np.testing.assert_array_equal(labels != PAD_ID, target_ids != PAD_ID)  # same length, pieces + 1
        assert (target_ids[:, 0] == CLS_ID).all()
        both = (labels[:, :-1] != PAD_ID) & (target_ids[:, 1:] != PAD_ID)
        np.testing.assert_array_equal(labels[:, :-1][both], target_ids[:, 1:][both])
        last = (labels != PAD_ID).sum(axis=1) - 1
        assert (labels[np.arange(len(labels)), last] == SEP_ID).all()
        # widths: the longest row rounded up to 16, capped
        s, t = source_ids.shape[1], target_ids.shape[1]
        assert s == rounded(int(inputs["source_mask"].sum(1).max()), SOURCE_LEN)
        assert t == rounded(int(inputs["target_mask"].sum(1).max()), TARGET_LEN)
        widths.add((s, t))
    assert {s for s, _ in widths} >= {16, SOURCE_LEN} and {t for _, t in widths} >= {16, TARGET_LEN}


def test_batches_obey_the_token_budget_in_multiples_of_8(first_batches):
    over = 0
    for inputs, _ in first_batches:
        rows, s, t = len(inputs["source_ids"]), inputs["source_ids"].shape[1], inputs["target_ids"].shape[1]
        assert rows % ROW_MULTIPLE == 0 and rows >= ROW_MULTIPLE
        assert rows * (s + t) <= BATCH_TOKENS or rows == ROW_MULTIPLE
        over += rows * (s + t) > BATCH_TOKENS
    row_counts = {len(inputs["source_ids"]) for inputs, _ in first_batches}
    assert len(row_counts) > 2 and max(row_counts) > 16  # short pairs pack many rows, long ones few
    assert 0 < over  # the longest pairs: 8 rows even above the budget


def test_batches_hold_the_planned_pairs(first_batches, plan, rows):
    for batch, indices in zip(first_batches, plan.stream(0)):
        assert_batch_holds(batch, indices, rows)


def test_an_epoch_covers_every_pair_at_most_once(plan, examples):
    n = len(examples["source_lengths"])
    for epoch in (0, 1):
        indices = np.concatenate(plan.epoch(epoch))
        assert len(np.unique(indices)) == len(indices) == n  # 496 pairs: one chunk, a multiple of 8, none dropped
    assert [b.tolist() for b in plan.epoch(0)] != [b.tolist() for b in plan.epoch(1)]
    # in chunks of 100, each chunk's last 100 % 8 = 4 shuffled pairs are dropped
    chunked = np.concatenate(epoch_batches(plan.source_widths, plan.target_widths, BATCH_TOKENS, SEED, 0, chunk=100))
    assert len(np.unique(chunked)) == len(chunked) == 4 * 96 + 96


@pytest.mark.parametrize("start", [1, 17, 45])
def test_stream_from_start_batch_is_the_tail_of_the_stream(examples, plan, first_batches, start):
    fresh = BatchPlan(plan.source_widths, plan.target_widths, BATCH_TOKENS, SEED)  # no counts kept
    tail, whole = fresh.stream(start), plan.stream(0)
    for _ in range(start):
        next(whole)
    for _ in range(60):
        np.testing.assert_array_equal(next(tail), next(whole))
    resumed = train_dataset(examples, BATCH_TOKENS, SEED, SOURCE_LEN, TARGET_LEN, start_batch=start).take(3)
    for number, batch in enumerate(resumed, start=start):
        if number < len(first_batches):
            for got, expected in zip(numpy_batch(batch), first_batches[number]):
                for name in expected:
                    np.testing.assert_array_equal(got[name], expected[name])


def test_other_seed_other_batches(plan):
    other = BatchPlan(plan.source_widths, plan.target_widths, BATCH_TOKENS, SEED + 1)
    assert [b.tolist() for b in other.epoch(0)] != [b.tolist() for b in plan.epoch(0)]


def test_too_few_pairs_for_a_batch(examples):
    few = {"source_flat": examples["source_flat"][:20], "source_lengths": np.array([5, 5, 5, 5], np.int32),
           "target_flat": examples["target_flat"][:8], "target_lengths": np.array([2, 2, 2, 2], np.int32)}
    with pytest.raises(ValueError, match="4 training pairs are fewer than one batch of 8"):
        train_dataset(few, BATCH_TOKENS, SEED, SOURCE_LEN, TARGET_LEN)


# --- eval batches -------------------------------------------------------------------------------

def test_eval_batches_cover_every_pair_once_in_place(examples, rows):
    n = 491  # not a multiple of 8: the last batch is short, nothing dropped
    some = {"source_flat": examples["source_flat"][: examples["source_lengths"][:n].sum()],
            "source_lengths": examples["source_lengths"][:n],
            "target_flat": examples["target_flat"][: examples["target_lengths"][:n].sum()],
            "target_lengths": examples["target_lengths"][:n]}
    batches = eval_batches(some, BATCH_TOKENS, SOURCE_LEN, TARGET_LEN)
    indices = np.concatenate([batch[2] for batch in batches])
    np.testing.assert_array_equal(np.sort(indices), np.arange(n))
    for number, batch in enumerate(batches):
        inputs, _ = numpy_batch(batch)
        assert_batch_holds(batch, batch[2], rows)
        size, s, t = len(batch[2]), inputs["source_ids"].shape[1], inputs["target_ids"].shape[1]
        assert size * (s + t) <= BATCH_TOKENS or size <= ROW_MULTIPLE
        assert size % ROW_MULTIPLE == 0 or number == len(batches) - 1
    source_widths, target_widths = padded_widths(some, SOURCE_LEN, TARGET_LEN)
    assert (np.diff((source_widths + target_widths)[indices]) >= 0).all()  # sorted: similar pairs share a batch
    again = eval_batches(some, BATCH_TOKENS, SOURCE_LEN, TARGET_LEN)
    assert [b[2].tolist() for b in again] == [b[2].tolist() for b in batches]  # fixed batches


# --- distribute() on batches whose row count varies ----------------------------------------------

MIRRORED = """
import sys
import numpy as np
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
from trainformer.data.pipeline import distribute
from trainformer.data.seq2seq_pipeline import load_cached_pairs, train_dataset
examples = load_cached_pairs(sys.argv[1])
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
global_batches = train_dataset(examples, 1024, 5, 96, 40)
for (g_inputs, g_targets), (inputs, targets) in zip(global_batches.take(6), distribute(strategy, global_batches)):
    for name, whole in [*g_inputs.items(), ("labels", g_targets["labels"])]:
        parts = strategy.experimental_local_results(inputs[name] if name != "labels" else targets[name])
        assert len(parts) == 2 and parts[0].shape == parts[1].shape, name
        np.testing.assert_array_equal(np.concatenate([p.numpy() for p in parts]), whole.numpy())
    print(len(g_inputs["source_ids"]), end=" ")
"""


def test_distribute_splits_batches_of_varying_rows_across_replicas(cache_dir, tokenizer, examples):
    """Two logical CPUs need a fresh process (devices are fixed once TensorFlow starts)."""
    path = pairs_cache_file(cache_dir, tokenizer, "people-daily", "train", SOURCE_LEN, TARGET_LEN)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(MIRRORED), str(path)], env=ENV,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(set(result.stdout.split())) > 1  # the row count varied across the six batches
