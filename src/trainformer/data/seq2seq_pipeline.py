"""tf.data for seq2seq: (source, target) pairs, batched by a token budget.

Source ids are `[CLS] source [SEP]`, cut as classification cuts a text (classify_pipeline.encode).
Target pieces are kept without specials; `decoder_io` makes the decoder input `[CLS] pieces`
([CLS] starts) and the labels `pieces [SEP]` ([SEP] ends), one token shifted, in one place for
the batches and for the task's decoding.

Pair lengths vary far more than review lengths, so a fixed number of rows would either waste most
of a batch on padding or overflow memory on long pairs. A batch instead holds as many rows as fit
`rows * (S + T) <= batch_tokens` padded tokens, rows a multiple of ROW_MULTIPLE (replicas split
the rows; at least ROW_MULTIPLE rows even when one long pair alone breaks the budget). S and T are
the batch's longest source and target, rounded up to PAD_MULTIPLE (few distinct shapes, so few
XLA compilations) and capped at source_len / target_len. Rows of similar size share a batch:
a shuffled epoch is cut in chunks of CHUNK_PAIRS pairs, each chunk sorted by padded size and cut
greedily under the budget, and the epoch's batches are shuffled.

As for classification, batch n is a pure function of (seed, n): a resumed run restarts the stream
at its step with no iterator state. Epochs hold a varying number of batches here, so finding batch
n walks the epochs (their counts are kept once computed).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import tensorflow as tf

from trainformer.data.classify_pipeline import PAD_MULTIPLE, encode, permutation, save_arrays
from trainformer.data.tokenizer import Tokenizer
from trainformer.tokens import CLS_ID, PAD_ID, SEP_ID

ROW_MULTIPLE = 8  # rows per batch are a multiple of this: every replica count up to 8 (powers of 2) splits them
CHUNK_PAIRS = 4096  # pairs per chunk sorted by size: similar sizes, still a fresh mix per epoch
ARRAYS = ("source_flat", "source_lengths", "target_flat", "target_lengths")


# --- encoding and the cache ---------------------------------------------------------------------

def encode_targets(tokenizer: Tokenizer, texts: list[str], target_len: int, batch_size: int = 2048
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Texts -> their pieces, no specials, cut to target_len - 1 (room for [CLS] / [SEP]), as
    (flat ids int32, lengths int32)."""
    pieces, lengths = [], []
    for start in range(0, len(texts), batch_size):
        ids = tokenizer(tf.constant(texts[start : start + batch_size]))[:, : target_len - 1]  # (batch, None)
        pieces.append(ids.flat_values.numpy().astype(np.int32))
        lengths.append(ids.row_lengths().numpy().astype(np.int32))
    if not pieces:
        return np.zeros([0], np.int32), np.zeros([0], np.int32)
    return np.concatenate(pieces), np.concatenate(lengths)


def cached_encode_pairs(cache_dir: Path, tokenizer: Tokenizer, sources: list[str], targets: list[str],
                        fingerprint: str, split: str, source_len: int, target_len: int
                        ) -> tuple[dict[str, np.ndarray], bool]:
    """Encode the pairs once per (data, vocabulary, split, lengths) and keep them on disk (written
    then renamed: a crash never leaves half a cache), so eval needs no corpus.
    Returns ({"source_flat", "source_lengths", "target_flat", "target_lengths"}, was_cached);
    source ids are framed `[CLS] ... [SEP]`, target ids are the cut pieces without specials."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if source_len < 3 or target_len < 2:
        raise ValueError(f"source_len {source_len} / target_len {target_len} leave no room for a token")
    path = pairs_cache_file(cache_dir, tokenizer, fingerprint, split, source_len, target_len)
    if path.is_file():
        return load_cached_pairs(path), True
    source_flat, source_lengths = encode(tokenizer, sources, source_len)
    target_flat, target_lengths = encode_targets(tokenizer, targets, target_len)
    arrays = {"source_flat": source_flat, "source_lengths": source_lengths,
              "target_flat": target_flat, "target_lengths": target_lengths}
    save_arrays(path, arrays)
    return arrays, False


def load_cached_pairs(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as cached:
        return {name: cached[name] for name in ARRAYS}


def pairs_cache_file(cache_dir: Path, tokenizer: Tokenizer, fingerprint: str, split: str, source_len: int,
                     target_len: int) -> Path:
    key = f"{fingerprint}:{tokenizer.vocab_hash}:{split}:{source_len}:{target_len}"
    return cache_dir / f"{split}-pairs-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"


# --- in the graph: the [CLS]/[SEP] convention and padded batches -------------------------------

def decoder_io(pieces: tf.RaggedTensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
    """(batch, None) target pieces -> (target_ids `[CLS] pieces`, labels `pieces [SEP]`), each
    (batch, None) with one more token per row: the decoder reads target_ids[i] and predicts labels[i]."""
    rows = pieces.nrows()
    start = tf.fill([rows, 1], tf.constant(CLS_ID, pieces.dtype))
    end = tf.fill([rows, 1], tf.constant(SEP_ID, pieces.dtype))
    return tf.concat([start, pieces], axis=1), tf.concat([pieces, end], axis=1)


def pad_rows(rows: tf.RaggedTensor, cap: int) -> tf.Tensor:
    """(batch, None) -> (batch, width) padded with PAD_ID, width = the longest row rounded up to
    PAD_MULTIPLE, at most cap (rows are never longer than cap)."""
    longest = tf.cast(tf.reduce_max(rows.row_lengths()), tf.int64)
    width = tf.minimum((longest + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE, tf.constant(cap, tf.int64))
    return rows.to_tensor(default_value=PAD_ID, shape=tf.stack([rows.nrows(out_type=tf.int64), width]))


def gather_pairs(sources: tf.RaggedTensor, targets: tf.RaggedTensor, indices: tf.Tensor, source_len: int,
                 target_len: int) -> tuple[dict, dict]:
    """Pairs `indices` as (inputs {source_ids, source_mask (b, S), target_ids, target_mask (b, T)},
    targets {labels (b, T), source_tokens (b,)}), PAD where there is no token / no label;
    source_tokens counts each row's real source tokens (for the tokens/s of the progress line)."""
    source_ids = pad_rows(tf.gather(sources, indices), source_len)  # (b, S)
    target_ids, labels = decoder_io(tf.gather(targets, indices))  # (b, None) each
    target_ids, labels = pad_rows(target_ids, target_len), pad_rows(labels, target_len)  # (b, T) each
    inputs = {"source_ids": source_ids, "source_mask": source_ids != PAD_ID,
              "target_ids": target_ids, "target_mask": target_ids != PAD_ID}
    source_tokens = tf.reduce_sum(tf.cast(inputs["source_mask"], tf.int32), axis=1)
    return inputs, {"labels": labels, "source_tokens": source_tokens}


def ragged_pairs(examples: dict[str, np.ndarray]) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
    sources = tf.RaggedTensor.from_row_lengths(examples["source_flat"], examples["source_lengths"])
    targets = tf.RaggedTensor.from_row_lengths(examples["target_flat"], examples["target_lengths"])
    return sources, targets


# --- which pairs make a batch (numpy, a pure function of seed and batch number) -----------------

def padded_widths(examples: dict[str, np.ndarray], source_len: int, target_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's (source width, target width) once padded alone: what it costs a batch per row."""
    def padded(lengths: np.ndarray, cap: int) -> np.ndarray:
        return np.minimum((lengths.astype(np.int64) + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE, cap)

    return padded(examples["source_lengths"], source_len), padded(examples["target_lengths"] + 1, target_len)


def cut_by_budget(source_widths: np.ndarray, target_widths: np.ndarray, batch_tokens: int) -> list[int]:
    """Where to cut rows (in this order) into batches: greedily add groups of ROW_MULTIPLE rows
    while rows * (max S + max T) <= batch_tokens (a first group always goes in). A last group may
    be short (eval keeps every pair). Returns the batch boundaries, starting 0 and ending len."""
    n = len(source_widths)
    starts = list(range(0, n, ROW_MULTIPLE))
    group_s = np.maximum.reduceat(source_widths, starts).tolist() if n else []
    group_t = np.maximum.reduceat(target_widths, starts).tolist() if n else []
    bounds, rows, s, t = [0], 0, 0, 0
    for start, gs, gt in zip(starts, group_s, group_t):
        size = min(ROW_MULTIPLE, n - start)
        if rows and (rows + size) * (max(s, gs) + max(t, gt)) > batch_tokens:
            bounds.append(start)
            rows, s, t = 0, 0, 0
        rows, s, t = rows + size, max(s, gs), max(t, gt)
    return bounds + [n] if n else bounds


def by_size(indices: np.ndarray, source_widths: np.ndarray, target_widths: np.ndarray) -> np.ndarray:
    """indices sorted by padded size S + T, then S (stable: equal sizes keep their order)."""
    return indices[np.lexsort((source_widths[indices], source_widths[indices] + target_widths[indices]))]


def epoch_batches(source_widths: np.ndarray, target_widths: np.ndarray, batch_tokens: int, seed: int, epoch: int,
                  chunk: int = CHUNK_PAIRS) -> list[np.ndarray]:
    """One epoch's batches (pair indices, rows a multiple of ROW_MULTIPLE), in shuffled order.
    Each chunk's last n % ROW_MULTIPLE pairs of the shuffled order are dropped before sorting, so
    the dropped pairs are random ones, never always the longest, and a fresh few each epoch."""
    order = permutation(len(source_widths), seed, epoch)
    batches = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        part = by_size(part[: len(part) // ROW_MULTIPLE * ROW_MULTIPLE], source_widths, target_widths)
        bounds = cut_by_budget(source_widths[part], target_widths[part], batch_tokens)
        batches += [part[a:b] for a, b in zip(bounds, bounds[1:])]
    return [batches[i] for i in permutation(len(batches), seed, epoch, 1)]


@dataclass
class BatchPlan:
    """Batch n of a seed's endless stream, epoch after epoch; epochs differ in batch count, so
    locating batch n counts the batches of the epochs before it (counts kept once computed)."""

    source_widths: np.ndarray  # (pairs,) padded widths, see padded_widths
    target_widths: np.ndarray
    batch_tokens: int
    seed: int
    counts: dict[int, int] = field(default_factory=dict)  # epoch -> batches

    def epoch(self, epoch: int) -> list[np.ndarray]:
        batches = epoch_batches(self.source_widths, self.target_widths, self.batch_tokens, self.seed, epoch)
        self.counts[epoch] = len(batches)
        return batches

    def count(self, epoch: int) -> int:
        if epoch not in self.counts:
            self.epoch(epoch)
        return self.counts[epoch]

    def locate(self, batch: int) -> tuple[int, int]:
        """Batch number -> (epoch, offset in that epoch)."""
        epoch = 0
        while batch >= self.count(epoch):
            batch -= self.count(epoch)
            epoch += 1
        return epoch, batch

    def stream(self, start_batch: int = 0) -> Iterator[np.ndarray]:
        """Batch start_batch, start_batch + 1, ... for ever: (rows,) int64 pair indices each."""
        epoch, offset = self.locate(start_batch)
        while True:
            yield from self.epoch(epoch)[offset:]
            epoch, offset = epoch + 1, 0


# --- datasets -----------------------------------------------------------------------------------

def train_dataset(examples: dict[str, np.ndarray], batch_tokens: int, seed: int, source_len: int, target_len: int,
                  start_batch: int = 0) -> tf.data.Dataset:
    """An endless stream of token-budget (inputs, targets) batches from batch start_batch on, from
    cached_encode_pairs' arrays. The batch dimension is None: rows vary from batch to batch."""
    if len(examples["source_lengths"]) < ROW_MULTIPLE:
        raise ValueError(f"{len(examples['source_lengths'])} training pairs are fewer than one batch of {ROW_MULTIPLE}")
    plan = BatchPlan(*padded_widths(examples, source_len, target_len), batch_tokens, seed)
    sources, targets = ragged_pairs(examples)
    numbers = tf.data.Dataset.from_generator(
        lambda: plan.stream(start_batch), output_signature=tf.TensorSpec([None], tf.int64)
    )
    gather = tf.autograph.experimental.do_not_convert(
        lambda indices: gather_pairs(sources, targets, indices, source_len, target_len))
    batches = numbers.map(gather)
    return batches.prefetch(tf.data.AUTOTUNE)


def eval_batches(examples: dict[str, np.ndarray], batch_tokens: int, source_len: int, target_len: int
                 ) -> list[tuple[dict, dict, np.ndarray]]:
    """Every pair of a split exactly once, sorted by size, in fixed budget batches (the last one's
    rows may not be a multiple of ROW_MULTIPLE): (inputs, targets, indices), where indices are the
    rows' positions in the split, to put outputs back in split order."""
    source_widths, target_widths = padded_widths(examples, source_len, target_len)
    order = by_size(np.arange(len(source_widths), dtype=np.int64), source_widths, target_widths)
    bounds = cut_by_budget(source_widths[order], target_widths[order], batch_tokens)
    sources, targets = ragged_pairs(examples)
    batches = []
    for a, b in zip(bounds, bounds[1:]):
        inputs, labels = gather_pairs(sources, targets, tf.constant(order[a:b]), source_len, target_len)
        batches.append((inputs, labels, order[a:b]))
    return batches
