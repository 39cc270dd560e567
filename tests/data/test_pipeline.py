"""The masked-LM input pipeline on real People's Daily tokens: packing loses nothing,
masking follows BERT's recipe exactly, and the batch stream is a pure function of
(seed, batch number) so a resumed run sees the same batches."""

import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import load_config
from trainformer.data.pipeline import (
    NUM_SPECIAL, cached_token_stream, eval_batches, mask_batch, max_predictions, pack, pack_documents,
    tokenize_documents, train_dataset,
)
from trainformer.data.tokenizer import Tokenizer
from trainformer.tasks.mlm import MaskedLMTask
from trainformer.tokens import CLS_ID, MASK_ID, PAD_ID, SEP_ID

SEQ_LEN = 128
RATE = 0.15


@pytest.fixture(scope="module")
def documents(corpus):
    return corpus.train[:2000]


@pytest.fixture(scope="module")
def stream(tokenizer, documents):
    return tokenize_documents(tokenizer, documents, batch_size=512)


@pytest.fixture(scope="module")
def windows(stream):
    return pack(stream, SEQ_LEN)


@pytest.fixture(scope="module")
def masked(windows, tokenizer):
    """One training-style masking of 400 real windows (~7,500 targets)."""
    out = mask_batch(tf.constant(windows[:400]), tf.constant([7, 11], tf.int64), RATE, tokenizer.vocab_size)
    return windows[:400], {k: v.numpy() for k, v in out.items()}


def chosen(out):
    """(window, position) pairs of the real targets, their originals and inputs."""
    rows, slots = np.nonzero(out["masked_weights"] > 0)
    positions = out["masked_positions"][rows, slots]
    return rows, positions, out["masked_ids"][rows, slots], out["token_ids"][rows, positions]


def expected_count(window):
    return round(RATE * int(np.sum(window >= NUM_SPECIAL)))


# --- tokenize + pack ------------------------------------------------------------------------

def test_token_cache_is_rebuilt_when_the_corpus_or_the_vocabulary_changes(tmp_path, tokenizer, documents):
    docs, cache = documents[:300], tmp_path / "cache"
    first, cached = cached_token_stream(cache, tokenizer, docs, "corpus-a", "train")
    assert not cached
    again, cached = cached_token_stream(cache, tokenizer, docs, "corpus-a", "train")
    assert cached and np.array_equal(again, first)

    other = documents[300:600]  # another corpus (another fingerprint): its own tokens
    changed, cached = cached_token_stream(cache, tokenizer, other, "corpus-b", "train")
    assert not cached and np.array_equal(changed, tokenize_documents(tokenizer, other))

    vocab = tokenizer.vocab[:1000] + tokenizer.vocab[1001:]  # one token fewer: later ids shift
    retrained = Tokenizer(vocab, lowercase=True)
    changed, cached = cached_token_stream(cache, retrained, docs, "corpus-a", "train")
    assert not cached and np.array_equal(changed, tokenize_documents(retrained, docs))
    assert not np.array_equal(changed, first)

    _, cached = cached_token_stream(cache, tokenizer, documents[:50], "corpus-a", "valid")  # the split too
    assert not cached
    assert cached_token_stream(cache, tokenizer, docs, "corpus-a", "train")[1]  # the first entry is still there


def test_tokenize_documents_ends_each_document_with_sep(tokenizer, documents, stream):
    assert stream.dtype == np.int32
    assert np.sum(stream == SEP_ID) == len(documents)
    assert stream[-1] == SEP_ID
    # each [SEP] sits right after its document's tokens
    lengths = tokenizer(tf.constant(documents)).row_lengths().numpy()
    np.testing.assert_array_equal(np.flatnonzero(stream == SEP_ID), np.cumsum(lengths + 1) - 1)


def test_tokenize_documents_batches_do_not_matter(tokenizer, documents, stream):
    np.testing.assert_array_equal(tokenize_documents(tokenizer, documents, batch_size=333), stream)
    assert tokenize_documents(tokenizer, []).shape == (0,)


def test_pack_windows_have_shape_and_start_with_cls(stream, windows):
    assert windows.dtype == np.int32
    assert windows.shape == (-(-len(stream) // (SEQ_LEN - 1)), SEQ_LEN)
    assert np.all(windows[:, 0] == CLS_ID)
    assert not np.any(windows[:, 1:] == CLS_ID)
    assert not np.any(windows[:-1] == PAD_ID)  # only the last window is padded


def test_pack_loses_and_duplicates_no_token(stream, windows):
    body = windows[:, 1:].reshape(-1)
    tail = len(body) - len(stream)
    assert 0 <= tail < SEQ_LEN - 1
    assert np.all(body[len(stream):] == PAD_ID)
    np.testing.assert_array_equal(body[: len(stream)], stream)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 21])
def test_pack_edge_lengths(length):
    stream = np.arange(NUM_SPECIAL, NUM_SPECIAL + length, dtype=np.int32)
    windows = pack(stream, 8)
    assert windows.shape == (max(1, -(-length // 7)), 8)
    body = windows[:, 1:].reshape(-1)
    np.testing.assert_array_equal(body[:length], stream)
    assert np.all(body[length:] == PAD_ID)


@pytest.mark.parametrize("seq_len", [32, 128])
def test_pack_documents_starts_windows_at_documents_and_keeps_them_whole(stream, seq_len):
    """data.packing=documents: each window is [CLS] + whole documents (or one window-sized piece
    of a longer one) + [PAD]s, and together the windows hold every stream token once, with
    hardly any padding. At 32 tokens most People's Daily paragraphs are cut into pieces."""
    body = seq_len - 1
    windows = pack_documents(stream, seq_len)
    assert windows.dtype == np.int32 and windows.shape[1] == seq_len
    assert np.all(windows[:, 0] == CLS_ID) and not np.any(windows[:, 1:] == CLS_ID)
    documents = np.split(stream, np.flatnonzero(stream == SEP_ID) + 1)[:-1]  # each ends with its [SEP]
    expected = sorted(tuple(doc[start : start + body]) for doc in documents for start in range(0, len(doc), body))
    found = []
    for window in windows[:, 1:]:
        tokens = window[window != PAD_ID]
        np.testing.assert_array_equal(window[len(tokens):], PAD_ID)  # [PAD]s only after the documents
        found += [tuple(piece) for piece in np.split(tokens, np.flatnonzero(tokens == SEP_ID) + 1) if len(piece)]
    assert sorted(found) == expected  # whole documents, or a piece from a window's start
    assert len(windows) <= 1.01 * len(pack(stream, seq_len))  # best-fit leaves under 1% more windows


# --- masking --------------------------------------------------------------------------------

def test_mask_count_per_window_is_rate_times_candidates(masked):
    windows, out = masked
    counts = out["masked_weights"].sum(axis=1)
    expected = [expected_count(w) for w in windows]
    np.testing.assert_array_equal(counts, expected)
    assert out["masked_positions"].shape == (len(windows), max_predictions(SEQ_LEN, RATE))
    # the real targets are distinct positions inside each window
    for row in range(len(windows)):
        picked = out["masked_positions"][row][out["masked_weights"][row] > 0]
        assert len(set(picked.tolist())) == len(picked)


def test_targets_are_originals_and_never_special(masked):
    windows, out = masked
    rows, positions, targets, _ = chosen(out)
    np.testing.assert_array_equal(targets, windows[rows, positions])
    assert np.all(targets >= NUM_SPECIAL)
    assert out["masked_ids"].dtype == np.int32 and out["masked_weights"].dtype == np.float32


def test_only_chosen_positions_change(masked):
    windows, out = masked
    changed = out["token_ids"] != windows
    rows, positions, _, _ = chosen(out)
    allowed = np.zeros_like(changed)
    allowed[rows, positions] = True
    assert not np.any(changed & ~allowed)
    special = windows < NUM_SPECIAL
    np.testing.assert_array_equal(out["token_ids"][special], windows[special])
    np.testing.assert_array_equal(out["padding_mask"], windows != PAD_ID)


def test_bert_80_10_10_corruption(masked, tokenizer):
    _, out = masked
    _, _, targets, inputs = chosen(out)
    assert len(targets) > 5000
    to_mask = np.mean(inputs == MASK_ID)
    unchanged = np.mean(inputs == targets)
    random_other = np.mean((inputs != MASK_ID) & (inputs != targets))
    assert abs(to_mask - 0.8) < 0.03
    assert abs(unchanged - 0.1) < 0.03
    assert abs(random_other - 0.1) < 0.03
    randoms = inputs[(inputs != MASK_ID) & (inputs != targets)]
    assert randoms.min() >= NUM_SPECIAL and randoms.max() < tokenizer.vocab_size
    assert len(np.unique(randoms)) > 0.5 * len(randoms)  # really random, not one id


def test_cloze_masks_every_target(windows, tokenizer):
    out = mask_batch(tf.constant(windows[:50]), tf.constant([1, 2], tf.int64), RATE, tokenizer.vocab_size, cloze=True)
    out = {k: v.numpy() for k, v in out.items()}
    _, _, targets, inputs = chosen(out)
    assert len(targets) > 0
    assert np.all(inputs == MASK_ID)


def test_same_seed_same_masks_other_seed_other_masks(windows, tokenizer):
    batch = tf.constant(windows[:32])

    def run(seed):
        out = mask_batch(batch, tf.constant(seed, tf.int64), RATE, tokenizer.vocab_size)
        return {k: v.numpy() for k, v in out.items()}

    first, again, other = run([3, 4]), run([3, 4]), run([3, 5])
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
    assert not np.array_equal(first["masked_positions"], other["masked_positions"])
    assert not np.array_equal(first["token_ids"], other["token_ids"])


def test_span_masking_chooses_runs_of_neighbours_at_the_same_rate(windows, tokenizer):
    """mask_span=3: the same number of targets per window, in runs (a run is cut only where it
    meets a special token or the count runs out), where single-token masking leaves most alone."""

    def mean_run(span):
        out = mask_batch(tf.constant(windows[:200]), tf.constant([5, 6], tf.int64), RATE, tokenizer.vocab_size,
                         span=span)
        out = {k: v.numpy() for k, v in out.items()}
        np.testing.assert_array_equal(out["masked_weights"].sum(axis=1), [expected_count(w) for w in windows[:200]])
        rows, positions, targets, _ = chosen(out)
        np.testing.assert_array_equal(targets, windows[rows, positions])
        hit = np.zeros(windows[:200].shape, bool)
        hit[rows, positions] = True
        edges = np.diff(np.pad(hit, ((0, 0), (1, 1))).astype(np.int8), axis=1)  # +1 opens a run, -1 closes it
        return hit.sum() / np.sum(edges == 1)

    assert mean_run(1) < 1.5 and mean_run(3) > 2.5


@pytest.mark.parametrize("seq_len, rate", [(8, 0.15), (16, 0.15), (20, 0.15), (128, 0.15), (128, 0.4), (50, 0.3)])
def test_max_predictions_never_cuts_targets(seq_len, rate):
    """Windows with no special token after [CLS] have the most candidates."""
    rng = np.random.default_rng(seq_len)
    full = rng.integers(NUM_SPECIAL, 100, size=(16, seq_len)).astype(np.int32)
    full[:, 0] = CLS_ID
    full[8:, seq_len // 2:] = PAD_ID  # and some half-padded ones
    out = mask_batch(tf.constant(full), tf.constant([0, 0], tf.int64), rate, 100)
    candidates = np.sum(full >= NUM_SPECIAL, axis=1)
    np.testing.assert_array_equal(out["masked_weights"].numpy().sum(axis=1), [round(rate * n) for n in candidates])
    assert out["masked_positions"].shape[1] == max_predictions(seq_len, rate)


# --- train_dataset / eval_batches -----------------------------------------------------------

BATCH = 8
NUM_WINDOWS = 100  # 12 batches per epoch, 4 windows dropped
PER_EPOCH = NUM_WINDOWS // BATCH


@pytest.fixture(scope="module")
def small_windows(stream):
    return pack(stream, 32)[:NUM_WINDOWS]


def take(windows, n, seed=5, start_batch=0, shifted=False):
    dataset = train_dataset(windows, BATCH, seed, RATE, 8000, start_batch=start_batch, shifted=shifted)
    return [
        ({k: v.numpy() for k, v in inputs.items()}, {k: v.numpy() for k, v in targets.items()})
        for inputs, targets in dataset.take(n)
    ]


def same_batch(a, b):
    return all(np.array_equal(a[i][k], b[i][k]) for i in range(2) for k in a[i])


def unmask(batch):
    """The original windows of a batch, from its inputs and targets."""
    inputs, targets = batch
    ids = inputs["token_ids"].copy()
    rows, slots = np.nonzero(targets["masked_weights"] > 0)
    ids[rows, inputs["masked_positions"][rows, slots]] = targets["masked_ids"][rows, slots]
    return ids


@pytest.fixture(scope="module")
def reference(small_windows):
    return take(small_windows, 2 * PER_EPOCH + 4)


def test_batches_have_model_inputs_and_targets(reference):
    inputs, targets = reference[0]
    assert set(inputs) == {"token_ids", "padding_mask", "masked_positions"}
    assert set(targets) == {"masked_ids", "masked_weights"}
    assert inputs["token_ids"].shape == (BATCH, 32)
    assert inputs["masked_positions"].shape == targets["masked_ids"].shape == (BATCH, max_predictions(32, RATE))


def test_train_dataset_is_deterministic(small_windows, reference):
    again = take(small_windows, 3)
    assert all(same_batch(a, b) for a, b in zip(again, reference[:3]))
    other = take(small_windows, 3, seed=6)
    assert not any(same_batch(a, b) for a, b in zip(other, reference[:3]))


def test_each_epoch_is_a_permutation_of_windows_with_fresh_masks(small_windows, reference):
    known = {w.tobytes(): i for i, w in enumerate(small_windows)}
    epochs = []
    for e in range(2):
        seen = {}
        for batch in reference[e * PER_EPOCH : (e + 1) * PER_EPOCH]:
            for window, row_positions, row_weights in zip(
                unmask(batch), batch[0]["masked_positions"], batch[1]["masked_weights"]
            ):
                index = known[window.tobytes()]  # KeyError: the batch holds a window we never made
                assert index not in seen  # no repeat within an epoch
                seen[index] = frozenset(row_positions[row_weights > 0].tolist())
        assert len(seen) == PER_EPOCH * BATCH
        epochs.append(seen)
    common = set(epochs[0]) & set(epochs[1])
    assert len(common) >= 0.8 * PER_EPOCH * BATCH
    differ = sum(epochs[0][i] != epochs[1][i] for i in common)
    assert differ >= 0.9 * len(common)  # new masks each epoch
    # masks are drawn per global batch number, not per batch-within-epoch
    # (same slot of the next epoch: the overlap of independent draws is small, of reused ones ~all)
    common = total = 0
    for k in range(PER_EPOCH):
        for e0, e1 in zip(*(zip(reference[j][0]["masked_positions"], reference[j][1]["masked_weights"])
                            for j in (k, k + PER_EPOCH))):
            first, second = set(e0[0][e0[1] > 0].tolist()), set(e1[0][e1[1] > 0].tolist())
            common, total = common + len(first & second), total + len(first)
    assert common / total < 0.4, common / total
    order = [known[w.tobytes()] for b in reference[: 2 * PER_EPOCH] for w in unmask(b)]
    assert order[: PER_EPOCH * BATCH] != order[PER_EPOCH * BATCH :]  # and a new order


@pytest.mark.parametrize("start", [5, PER_EPOCH - 1, PER_EPOCH, PER_EPOCH + 3, 2 * PER_EPOCH - 1])
def test_start_batch_resumes_the_same_stream(small_windows, reference, start):
    resumed = take(small_windows, 3, start_batch=start)
    for offset, batch in enumerate(resumed):
        assert same_batch(batch, reference[start + offset]), f"batch {start + offset}"


def test_mask_spread_falls_from_high_to_low_rate_and_resumes(stream):
    """data.mask_spread: a run's batch 0 masks mask_rate + spread of each window's tokens, its
    last batch (train.steps) mask_rate - spread, linearly between, across epochs; positions are
    sized for the highest rate, and a resumed stream masks as the uninterrupted one."""
    total, rate, spread = 24, 0.3, 0.1
    config = load_config(None, ["data.seq_len=32", f"data.mask_rate={rate}", f"data.mask_spread={spread}",
                                f"train.steps={total}", f"train.batch_size={BATCH}"])
    task = MaskedLMTask(config)
    task.vocab_size = 8000
    task._use_streams({"train": stream[:3_200], "valid": stream[:2_000]})  # ~100 windows: 12 batches an epoch

    def batches(start: int) -> list:
        return [({k: v.numpy() for k, v in inputs.items()}, {k: v.numpy() for k, v in targets.items()})
                for inputs, targets in task.train_batches(start).take(total - start)]

    uninterrupted, shares = batches(0), []
    for n, (inputs, targets) in enumerate(uninterrupted):
        assert inputs["masked_positions"].shape[1] == max_predictions(32, rate + spread)
        scheduled = rate + spread * (1 - 2 * n / (total - 1))
        candidates = np.sum(unmask((inputs, targets)) >= NUM_SPECIAL, axis=1)
        np.testing.assert_array_equal(targets["masked_weights"].sum(axis=1), np.round(candidates * scheduled))
        shares.append(targets["masked_weights"].sum() / candidates.sum())
    assert shares[0] == pytest.approx(0.4, abs=0.02) and shares[-1] == pytest.approx(0.2, abs=0.02)
    assert all(same_batch(a, b) for a, b in zip(batches(15), uninterrupted[15:]))


def test_shifted_windows_cut_the_stream_anew_each_epoch(small_windows):
    """data.shift_windows: every window is [CLS] + a run of the packed stream; an epoch's windows
    start at one offset (mod the body length), another epoch's at another; resuming still
    replays the uninterrupted stream."""
    per_epoch = (NUM_WINDOWS - 1) // BATCH
    body_len = small_windows.shape[1] - 1
    runs = np.lib.stride_tricks.sliding_window_view(small_windows[:, 1:].reshape(-1), body_len)
    batches = take(small_windows, 2 * per_epoch, shifted=True)
    offsets = []
    for epoch in range(2):
        starts = []
        for window in (w for b in batches[epoch * per_epoch : (epoch + 1) * per_epoch] for w in unmask(b)):
            assert window[0] == CLS_ID
            found = np.flatnonzero((runs == window[1:]).all(axis=1))
            assert len(found), "a window that is not a run of the stream"
            starts.append(int(found[0]))
        assert len(set(starts)) == len(starts) == per_epoch * BATCH  # no window twice in an epoch
        assert len({start % body_len for start in starts}) == 1  # one cut per epoch
        offsets.append(starts[0] % body_len)
    assert offsets[0] != offsets[1]
    for start in (per_epoch - 1, per_epoch + 2):
        assert all(same_batch(a, b) for a, b in zip(take(small_windows, 2, start_batch=start, shifted=True),
                                                    batches[start:]))


def test_long_windows_take_the_last_steps_at_the_same_tokens_per_batch(stream):
    """data.long_seq_len: batches 0-5 of 32-token windows, then batches of 128-token ones (a
    quarter of the rows); a resumed run's stream, from either phase, is the uninterrupted one's."""
    config = load_config(None, ["data.seq_len=32", "data.long_seq_len=128", "data.long_fraction=0.25",
                                "train.steps=8", f"train.batch_size={BATCH}"])
    task = MaskedLMTask(config)
    task.vocab_size = 8000
    task._use_streams({"train": stream[:20_000], "valid": stream[:2_000]})

    def batches(start: int) -> list:
        return [({k: v.numpy() for k, v in inputs.items()}, {k: v.numpy() for k, v in targets.items()})
                for inputs, targets in task.train_batches(start).take(8 - start)]

    uninterrupted = batches(0)
    assert [b[0]["token_ids"].shape for b in uninterrupted] == [(BATCH, 32)] * 6 + [(BATCH // 4, 128)] * 2
    known = {window.tobytes() for window in pack(stream[:20_000], 128)}
    assert all(window.tobytes() in known for b in uninterrupted[6:] for window in unmask(b))
    for start in (5, 7):
        assert all(same_batch(a, b) for a, b in zip(batches(start), uninterrupted[start:]))


def test_document_packing_cuts_the_train_windows_and_leaves_valid_as_a_stream(stream):
    """data.packing=documents changes what training reads; held-out cloze keeps stream windows,
    so its figures compare with a stream-packed run's. Long windows are packed the same way."""
    config = load_config(None, ["data.seq_len=32", "data.long_seq_len=128", "data.packing=documents"])
    task = MaskedLMTask(config)
    task._use_streams({"train": stream[:20_000], "valid": stream[:2_000]})
    np.testing.assert_array_equal(task.windows["train"], pack_documents(stream[:20_000], 32))
    np.testing.assert_array_equal(task.long_windows, pack_documents(stream[:20_000], 128))
    np.testing.assert_array_equal(task.windows["valid"], pack(stream[:2_000], 32))


def test_too_few_windows_for_a_batch(small_windows):
    with pytest.raises(ValueError, match="fewer than one batch"):
        train_dataset(small_windows[:BATCH - 1], BATCH, 0, RATE, 8000)


def test_eval_batches_are_fixed_and_cover_all_windows(small_windows):
    first = eval_batches(small_windows, 16, 3, RATE, 8000)
    second = eval_batches(small_windows, 16, 3, RATE, 8000)
    assert len(first) == -(-NUM_WINDOWS // 16)
    assert all(
        np.array_equal(a[i][k].numpy(), b[i][k].numpy()) for a, b in zip(first, second) for i in range(2) for k in a[i]
    )
    originals = np.concatenate([unmask(({k: v.numpy() for k, v in x.items()}, {k: v.numpy() for k, v in y.items()}))
                                for x, y in first])
    np.testing.assert_array_equal(originals, small_windows)
    for inputs, targets in first:
        picked = tf.gather(inputs["token_ids"], inputs["masked_positions"], batch_dims=1).numpy()
        assert np.all(picked[targets["masked_weights"].numpy() > 0] == MASK_ID)


def test_eval_targets_do_not_depend_on_the_batch_size(small_windows):
    """Runs at batch 8, 16 and 40 score the same held-out targets, window for window: their cloze
    figures compare (the masks once followed the batch, and batch 16's baseline read 6.15%
    where batch 32's read 5.97%)."""
    def rows(batch_size):  # {key: every batch's tensor, concatenated over the windows}
        batches = eval_batches(small_windows, batch_size, 3, RATE, 8000)
        assert all(len(inputs["token_ids"]) == batch_size for inputs, _ in batches[:-1])
        inputs, targets = zip(*batches)
        return {k: np.concatenate([b[k].numpy() for b in part]) for part in (inputs, targets) for k in part[0]}

    reference = rows(8)
    for batch_size in (16, 40):
        for key, value in rows(batch_size).items():
            np.testing.assert_array_equal(value, reference[key], err_msg=key)
    assert eval_batches(small_windows[:0], 8, 3, RATE, 8000) == []  # a split too short for one window


def test_token_weights_mask_heavy_tokens_more_at_the_same_count(windows, tokenizer):
    """Equal weights choose exactly what uniform masking chooses; weighting a tenth of the
    vocabulary 8x masks those tokens far more often, with the same number of targets per window."""
    batch, seed = tf.constant(windows[:200]), tf.constant([3, 4], tf.int64)
    uniform = mask_batch(batch, seed, RATE, tokenizer.vocab_size)
    equal = mask_batch(batch, seed, RATE, tokenizer.vocab_size, token_weights=tf.fill([tokenizer.vocab_size], 2.5))
    for key in uniform:
        np.testing.assert_array_equal(equal[key].numpy(), uniform[key].numpy())

    heavy = np.arange(tokenizer.vocab_size) % 10 == 0  # (vocab,)
    weights = tf.constant(np.where(heavy, 8.0, 1.0), tf.float32)
    out = {k: v.numpy() for k, v in mask_batch(batch, seed, RATE, tokenizer.vocab_size, token_weights=weights).items()}
    np.testing.assert_array_equal(out["masked_weights"].sum(axis=1), [expected_count(w) for w in windows[:200]])
    rows, positions, targets, _ = chosen(out)
    np.testing.assert_array_equal(targets, windows[rows, positions])
    real = windows[:200][windows[:200] >= NUM_SPECIAL]
    assert heavy[real].mean() < 0.2 < heavy[targets].mean()
    masked_heavy = heavy[targets].sum() / heavy[real].sum()  # the share of heavy tokens masked
    masked_light = (~heavy[targets]).sum() / (~heavy[real]).sum()
    assert masked_heavy > 3 * masked_light
