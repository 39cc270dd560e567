"""tf.data for masked-LM pretraining: tokenize once, pack, mask dynamically, batch, prefetch.

Packing: documents are joined into one token stream, each followed by [SEP], and cut into
windows of `seq_len` tokens that start with [CLS]. News paragraphs are short (People's
Daily: ~95 characters), so padding each to 128 would waste most of the compute. Tokens in a
window attend across document boundaries, as in RoBERTa's FULL-SENTENCES packing: [SEP]
marks the boundary. A block-diagonal mask would cost a (seq, seq) mask per example; RoBERTa
measured per-document packing within a few tenths of a point of FULL-SENTENCES (we have not
measured it on our corpora). data.packing=documents (pack_documents) keeps the cross-document
attention but starts every window at a document's start, as a fine-tune reads a text: a tie on
zh-sentiment (benchmarks/classify/README.md, 31st pass).

Order and masks are a pure function of (seed, batch number) via stateless random ops, so the
stream is reproducible and a resumed run restarts it at its step, with no iterator state.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainformer.data import whole_words
from trainformer.data.tokenizer import Tokenizer
from trainformer.tokens import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID

# Held-out windows are cloze-masked this many at a time, whatever the batch size: a window's
# targets then do not depend on train.batch_size (32, the recipes' batch, keeps earlier figures).
EVAL_MASK_ROWS = 32

# Which of mask_batch's tensors are model inputs and which are targets, per objective. ELECTRA's
# model also reads the original tokens (to label replacements) and one uniform per masked
# position (its generator's sample); its loss weighs every real token.
MLM_KEYS = (("token_ids", "padding_mask", "masked_positions"), ("masked_ids", "masked_weights"))
ELECTRA_KEYS = (("token_ids", "padding_mask", "masked_positions", "masked_ids", "sample_uniform"),
                ("masked_ids", "masked_weights", "padding_mask"))


def tokenize_documents(tokenizer: Tokenizer, documents: list[str], batch_size: int = 2048) -> np.ndarray:
    """Documents -> one int32 token stream with [SEP] after each document."""
    pieces = []
    for start in range(0, len(documents), batch_size):
        ids = tokenizer(tf.constant(documents[start : start + batch_size]))  # (batch, None)
        sep = tf.fill([ids.nrows(), 1], tf.constant(SEP_ID, tf.int32))
        pieces.append(tf.concat([ids, sep], axis=1).flat_values.numpy())
    return np.concatenate(pieces) if pieces else np.zeros([0], np.int32)


def cached_token_stream(
    cache_dir: Path, tokenizer: Tokenizer, documents: list[str], corpus_fingerprint: str, split: str
) -> tuple[np.ndarray, bool]:
    """The token stream of one split, tokenized once per (corpus, vocabulary) and kept on disk.

    Returns (stream, was_cached)."""
    path = cache_file(cache_dir, tokenizer, corpus_fingerprint, split)
    return cached_array(path, lambda: tokenize_documents(tokenizer, documents))


def cached_word_starts(
    cache_dir: Path, tokenizer: Tokenizer, documents: list[str], corpus_fingerprint: str, split: str
) -> tuple[np.ndarray, bool]:
    """data.whole_words: which tokens of the split's stream start a word (whole_words.word_starts),
    (tokens,) bool, computed once per (corpus, vocabulary, segmenter). Returns (starts, was_cached)."""
    path = cache_file(cache_dir, tokenizer, corpus_fingerprint, split, kind=f"word-starts:{whole_words.SEGMENTER}")
    return cached_array(path, lambda: whole_words.word_starts(tokenizer, documents))


def cached_array(path: Path, compute) -> tuple[np.ndarray, bool]:
    """np.load(path), or compute() saved there first. Returns (array, was_cached)."""
    if path.is_file():
        return np.load(path), True
    array = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npy")  # write then rename: a crash never leaves half a cache
    np.save(partial, array)
    partial.replace(path)
    return array, False


def cache_file(cache_dir: Path, tokenizer: Tokenizer, corpus_fingerprint: str, split: str, kind: str = "") -> Path:
    """Where the token stream (or, with kind, another per-token array) of one split of one
    corpus under one vocabulary is cached."""
    key = f"{corpus_fingerprint}:{tokenizer.vocab_hash}:{split}" + (f":{kind}" if kind else "")
    return cache_dir / f"{split}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npy"


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a token stream into (num_windows, seq_len) windows: [CLS] + seq_len-1 stream tokens,
    the last window padded with [PAD]. Every stream token lands in exactly one window."""
    body = seq_len - 1
    num_windows = max(1, math.ceil(len(stream) / body))
    padded = np.full(num_windows * body, PAD_ID, np.int32)
    padded[: len(stream)] = stream
    cls = np.full([num_windows, 1], CLS_ID, np.int32)
    return np.concatenate([cls, padded.reshape(num_windows, body)], axis=1)


def pack_documents(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a token stream into (num_windows, seq_len) windows that each start at a document's
    start: [CLS], whole documents (each with its [SEP]), [PAD] to the end.

    A fine-tune reads [CLS] + one whole review; pack() mostly shows a document cut by a window
    edge (a 44-token review lands whole in a 64-token window ~30% of the time). Here every
    document of up to seq_len-1 tokens is read whole, from position 1 of its window or after
    other whole documents; a longer one is cut into seq_len-1 pieces, each at a window's start
    or after whole documents. Pieces go into windows best-fit decreasing (the fullest window
    that still has room), so little is padding. Every stream token lands in exactly one window;
    the windows are a pure function of the stream (the same in every run).
    """
    body = seq_len - 1
    ends = np.flatnonzero(stream == SEP_ID) + 1  # each document ends after its [SEP]
    pieces = [piece for document in np.split(stream, ends) if len(document)
              for piece in np.split(document, range(body, len(document), body))]
    windows: list[list[np.ndarray]] = []  # the pieces of each window
    room: list[list[int]] = [[] for _ in range(body + 1)]  # room[r]: the windows with r tokens free
    for piece in sorted(pieces, key=len, reverse=True):  # stable: equal lengths keep stream order
        free = next((r for r in range(len(piece), body + 1) if room[r]), None)  # the least room that holds it
        if free is None:
            window, free = len(windows), body
            windows.append([])
        else:
            window = room[free].pop(0)
        windows[window].append(piece)
        room[free - len(piece)].append(window)
    packed = np.full([max(1, len(windows)), seq_len], PAD_ID, np.int32)
    packed[:, 0] = CLS_ID
    for row, window in enumerate(windows):
        tokens = np.concatenate(window)
        packed[row, 1 : 1 + len(tokens)] = tokens
    return packed


def pack_word_starts(starts: np.ndarray, seq_len: int) -> np.ndarray:
    """A word_starts stream cut as pack() cuts its token stream: (num_windows, seq_len) bool,
    True at [CLS] and at each window's first stream token (a word cut by a window edge is
    two words), False on padding."""
    windows = pack(starts.astype(np.int32), seq_len) != PAD_ID  # [CLS] (id 2) True, [PAD] (0) False
    windows[:, 1] = True
    return windows


def max_predictions(seq_len: int, mask_rate: float) -> int:
    """Masked positions per window: enough for every window, so no target is ever cut."""
    return math.ceil(seq_len * mask_rate)


def mask_rate_at(batch_number: tf.Tensor, mask_rate: float, spread: float, total_batches: int) -> tf.Tensor:
    """The masking rate of training batch `batch_number` (a scalar tensor): mask_rate + spread at
    the first batch, falling linearly to mask_rate - spread at batch total_batches - 1 and staying
    there (Ankner et al. 2024, "Dynamic Masking Rate Schedules for MLM Pretraining": a falling rate
    trains on both regimes, the high rate's many targets early and the low rate's context late)."""
    progress = tf.minimum(tf.cast(batch_number, tf.float32) / max(total_batches - 1, 1), 1.0)
    return mask_rate + spread * (1.0 - 2.0 * progress)


def mask_batch(
    token_ids: tf.Tensor, seed: tf.Tensor, mask_rate: float | tf.Tensor, vocab_size: int, cloze: bool = False,
    span: int = 1, token_weights: tf.Tensor | None = None, word_starts: tf.Tensor | None = None,
    predictions: int | None = None,
) -> dict[str, tf.Tensor]:
    """Choose round(mask_rate * n) of the n non-special tokens of each window and corrupt them.

    Args:
        token_ids: (batch, seq) int32 windows.
        seed: (2,) int stateless seed.
        mask_rate: a float, or a scalar float32 tensor (a scheduled rate: mask_rate_at) with
            `predictions` set.
        cloze: replace every chosen token by [MASK] (evaluation). Otherwise BERT's 80% [MASK],
            10% random token, 10% unchanged (training).
        span: choose runs of `span` neighbouring tokens (overlapping runs merge into longer ones),
            as whole-word and n-gram masking do for Chinese (Cui et al. 2019): a masked character
            of a word is then rarely given away by the rest of the word. 1: single tokens.
        token_weights: (vocab,) float32 weights > 0, or None (uniform): a window's masked
            positions are drawn without replacement with probability proportional to their
            tokens' weights (selective masking: data/selective.py).
        word_starts: (batch, seq) bool, True where a token starts a word (data/whole_words.py):
            the chosen tokens come in whole words, every word as likely as any other (the
            round(mask_rate * n) budget may end inside the last word chosen); not with span or
            token_weights. None: single tokens.
        predictions: P, the masked positions per window: max_predictions(seq, the highest rate
            the batch may have); None: max_predictions(seq, mask_rate), mask_rate a float.

    Returns model inputs and targets: token_ids (batch, seq), padding_mask (batch, seq) bool,
    masked_positions / masked_ids (batch, P) int32, masked_weights (batch, P) float32 and
    sample_uniform (batch, P) float32 in [0, 1) (ELECTRA's generator samples with it).
    """
    if word_starts is not None and (span > 1 or token_weights is not None):
        raise ValueError("whole-word masking chooses words by one draw each: not with span or token_weights")
    batch, seq_len = tf.shape(token_ids)[0], token_ids.shape[1]
    num_predictions = predictions or max_predictions(seq_len, mask_rate)
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=4)
    candidate = token_ids >= NUM_SPECIAL  # (batch, seq)
    num_masked = tf.math.round(tf.reduce_sum(tf.cast(candidate, tf.float32), axis=1) * mask_rate)
    num_masked = tf.cast(num_masked, tf.int32)  # (batch,)

    # The candidates with the smallest random scores are chosen; non-candidates score inf.
    scores = tf.random.stateless_uniform([batch, seq_len], seeds[0])  # (batch, seq)
    if token_weights is not None:
        # Exponential draws divided by the weights: the smallest is position i with probability
        # w_i / sum(w), then the next among the rest, ... (Efraimidis & Spirakis 2006). Monotone
        # in the uniform draw, so equal weights choose what the uniform scores choose.
        scores = -tf.math.log1p(-scores) / tf.gather(token_weights, token_ids)
    if span > 1:  # a token scores the least draw within its run: the smallest scores come in runs
        scores = -tf.nn.max_pool1d(-scores[..., None], span, 1, "SAME")[..., 0]
    if word_starts is not None:  # word k's tokens all score draw k: chosen together (top_k keeps ties in order)
        word = tf.cumsum(tf.cast(word_starts, tf.int32), axis=1) - 1  # (batch, seq) word index, 0 at [CLS]
        scores = tf.gather(scores, word, batch_dims=1)
    scores = tf.where(candidate, scores, float("inf"))
    _, positions = tf.math.top_k(-scores, k=num_predictions)  # (batch, P)
    weights = tf.sequence_mask(num_masked, num_predictions)  # (batch, P) bool
    positions = tf.where(weights, positions, 0)
    targets = tf.gather(token_ids, positions, batch_dims=1)  # (batch, P)

    if cloze:
        replacement = tf.fill(tf.shape(targets), MASK_ID)
    else:
        draw = tf.random.stateless_uniform(tf.shape(targets), seeds[1])
        random_ids = tf.random.stateless_uniform(
            tf.shape(targets), seeds[2], minval=NUM_SPECIAL, maxval=vocab_size, dtype=tf.int32
        )
        replacement = tf.where(draw < 0.8, MASK_ID, tf.where(draw < 0.9, random_ids, targets))
    # Scatter the replacements into the chosen positions (padding slots leave the input alone).
    hit = tf.one_hot(positions, seq_len, dtype=tf.int32) * tf.cast(weights, tf.int32)[..., None]
    is_masked = tf.reduce_sum(hit, axis=1) > 0  # (batch, seq)
    replaced = tf.reduce_sum(hit * replacement[..., None], axis=1)  # (batch, seq)
    inputs = tf.where(is_masked, replaced, token_ids)
    return {
        "token_ids": inputs,
        "padding_mask": token_ids != PAD_ID,
        "masked_positions": positions,
        "masked_ids": targets,
        "masked_weights": tf.cast(weights, tf.float32),
        "sample_uniform": tf.random.stateless_uniform(tf.shape(targets), seeds[3]),
    }


def train_dataset(
    windows: np.ndarray, batch_size: int, seed: int, mask_rate: float, vocab_size: int, start_batch: int = 0,
    keys: tuple = MLM_KEYS, mask_span: int = 1, token_weights: np.ndarray | None = None, shifted: bool = False,
    word_starts: np.ndarray | None = None, mask_spread: float = 0.0, total_batches: int = 1,
) -> tf.data.Dataset:
    """An endless stream of masked batches; a new window order and new masks every epoch
    (token_weights: see mask_batch). shifted: each epoch also cuts the stream at new window
    boundaries (see shifted_windows). word_starts: (num_windows, seq) bool, pack_word_starts'
    for these windows: whole words are masked (not with shifted). mask_spread > 0: the rate falls
    from mask_rate + mask_spread to mask_rate - mask_spread over total_batches (mask_rate_at).

    Batch n is a pure function of (windows, seed, n), so a resumed run starts the stream at
    `start_batch` and sees exactly the batches an uninterrupted run would have: no iterator
    state to checkpoint, under any distribution strategy.
    """
    num_windows = train_window_count(windows, shifted)
    if num_windows < batch_size:
        raise ValueError(f"{num_windows} training windows are fewer than one batch of {batch_size}")
    batches_per_epoch = num_windows // batch_size  # the remainder of each shuffled epoch is dropped
    first_epoch, first_offset = divmod(start_batch, batches_per_epoch)
    window_rows = shifted_windows(windows, seed) if shifted else unshifted_windows(windows)
    weights = None if token_weights is None else tf.constant(token_weights, tf.float32)  # (vocab,)
    if word_starts is not None and shifted:
        raise ValueError("whole-word masking reads the windows as packed: not with shifted windows")
    starts = None if word_starts is None else tf.constant(word_starts)  # (num_windows, seq)

    @tf.autograph.experimental.do_not_convert
    def epoch(index: tf.Tensor) -> tf.data.Dataset:
        """Epoch index's batches to come: (window ids (batch_size,), batch number, epoch) each."""
        order = tf.random.experimental.stateless_shuffle(
            tf.range(num_windows), seed=tf.stack([tf.constant(seed, tf.int64), index])
        )
        order = tf.reshape(order[: batches_per_epoch * batch_size], [batches_per_epoch, batch_size])
        offset = tf.where(index == first_epoch, tf.constant(first_offset, tf.int64), 0)
        numbers = tf.range(offset, batches_per_epoch, dtype=tf.int64)
        epochs = tf.fill(tf.shape(numbers), index)
        return tf.data.Dataset.from_tensor_slices((tf.gather(order, numbers), numbers, epochs))  # per batch

    predictions = max_predictions(windows.shape[1], mask_rate + mask_spread)

    @tf.autograph.experimental.do_not_convert
    def masked(ids: tf.Tensor, number: tf.Tensor, index: tf.Tensor):
        batch_number = index * batches_per_epoch + number
        mask_seed = tf.stack([tf.constant(seed + 1, tf.int64), batch_number])
        rate = mask_rate_at(batch_number, mask_rate, mask_spread, total_batches) if mask_spread else mask_rate
        masked = mask_batch(window_rows(ids, index), mask_seed, rate, vocab_size, span=mask_span,
                            token_weights=weights, word_starts=None if starts is None else tf.gather(starts, ids),
                            predictions=predictions)
        return split_targets(masked, keys)

    return (
        tf.data.Dataset.counter(start=first_epoch)
        .flat_map(epoch)
        .map(masked, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def train_window_count(windows: np.ndarray, shifted: bool) -> int:
    """Windows an epoch reads: all of the packing's, or one fewer when cut anew (shifted_windows)."""
    return len(windows) - 1 if shifted else len(windows)


def unshifted_windows(windows: np.ndarray):
    """rows(ids, epoch) -> the windows `ids`, (batch, seq), as packed, in every epoch."""
    all_windows = tf.constant(windows)  # (num_windows, seq)
    return lambda ids, epoch: tf.gather(all_windows, ids)


def shifted_windows(windows: np.ndarray, seed: int):
    """rows(ids, epoch) -> windows `ids`, (batch, seq), of the packed stream cut anew per epoch.

    Packed once, a document that straddles two windows is cut at the same place in every epoch:
    over ~20 epochs its two halves are never read together, and the tokens at a window's start
    never see their left context. Each epoch here starts its cut a random 0..seq-2 tokens into
    the stream (a pure function of (seed, epoch)), as dynamic masking draws new masks per epoch
    (Liu et al. 2019, RoBERTa): window w of an epoch reads stream tokens offset + w*(seq-1) on,
    after [CLS]. The cut holds one window fewer than the packing (windows 0..n-2): the tokens
    before the offset and after the last window sit out that epoch, a different few each time.
    """
    body_len = windows.shape[1] - 1
    stream = tf.constant(windows[:, 1:].reshape(-1))  # (num_windows * body_len,) the packed stream, [PAD]-ended

    def rows(ids: tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
        offset = tf.random.stateless_uniform([], tf.stack([tf.constant(seed + 2, tf.int64), epoch]),
                                             maxval=body_len, dtype=tf.int64)
        starts = offset + tf.cast(ids, tf.int64) * body_len  # (batch,)
        body = tf.gather(stream, starts[:, None] + tf.range(body_len, dtype=tf.int64))  # (batch, body_len)
        return tf.concat([tf.fill([tf.shape(ids)[0], 1], tf.constant(CLS_ID, body.dtype)), body], axis=1)

    return rows


def distribute(strategy: tf.distribute.Strategy, global_batches: tf.data.Dataset) -> tf.distribute.DistributedDataset:
    """Split every batch of the global_batches dataset across the replicas: replica r
    of R gets rows [r*b/R, (r+1)*b/R). Together they see exactly the one-device batch, so
    every strategy computes the same update; each worker builds the same global stream (a pure
    function of the batch number) and keeps only its replicas' rows.
    """
    replicas = strategy.num_replicas_in_sync

    def pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines  # replicas fed by this worker
        first = context.input_pipeline_id * local

        def rows_of_local_replicas(tensor: tf.Tensor) -> tf.Tensor:  # (b, ...) -> (local, b/R, ...)
            rows = tensor.shape[0]  # static where every batch has the same rows; later dims may vary
            rows = (tf.shape(tensor)[0] if rows is None else rows) // replicas  # None: token-budget batches
            per_replica = tf.reshape(tensor, tf.concat([[replicas, rows], tf.shape(tensor)[1:]], axis=0))
            return per_replica[first : first + local]

        @tf.autograph.experimental.do_not_convert
        def split(*batch):
            return tf.nest.map_structure(rows_of_local_replicas, batch)

        return global_batches.map(split).unbatch()  # local replicas take consecutive elements

    return strategy.distribute_datasets_from_function(pipeline)


def eval_batches(
    windows: np.ndarray, batch_size: int, seed: int, mask_rate: float, vocab_size: int, keys: tuple = MLM_KEYS
) -> list[tuple[dict, dict]]:
    """Fixed cloze-masked batches over all valid windows: the same targets at every eval, in
    `trainformer eval` and in runs of any batch size (masks are drawn EVAL_MASK_ROWS windows at a
    time, then cut into batches), so numbers are comparable across a run and between runs."""
    chunks = [
        mask_batch(tf.constant(windows[start : start + EVAL_MASK_ROWS]), tf.constant([seed, number], tf.int64),
                   mask_rate, vocab_size, cloze=True)
        for number, start in enumerate(range(0, len(windows), EVAL_MASK_ROWS))
    ]
    if not chunks:  # no held-out windows (a tiny corpus): no batches
        return []
    masked = {key: tf.concat([chunk[key] for chunk in chunks], axis=0) for key in chunks[0]}  # (windows, ...)
    return [
        split_targets({key: value[start : start + batch_size] for key, value in masked.items()}, keys)
        for start in range(0, len(windows), batch_size)
    ]


def split_targets(masked: dict, keys: tuple = MLM_KEYS) -> tuple[dict, dict]:
    """Split mask_batch's output into (model inputs, targets), as keys names them."""
    input_keys, target_keys = keys
    return {k: masked[k] for k in input_keys}, {k: masked[k] for k in target_keys}


def most_frequent_token(stream: np.ndarray) -> int:
    """The most frequent non-special token: the "always predict it" baseline."""
    counts = np.bincount(stream[stream >= NUM_SPECIAL])
    return int(np.argmax(counts))
