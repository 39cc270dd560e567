"""tf.data for classification: one example per row, `[CLS] text [SEP]`, batched by length.

Packing is for masked-LM only: a label belongs to one text. Padding every text to seq_len would
waste most of the compute on short reviews, so batches are made of texts of similar length
(sorted within chunks of BUCKET_BATCHES batches of a shuffled epoch) and padded to their own
longest text, rounded up to PAD_MULTIPLE (few distinct shapes, so few XLA compilations).

As for MLM, batch n is a pure function of (seed, n): a resumed run restarts the stream at its
step with no iterator state, under any strategy. The order comes from a counter-based hash
(splitmix64), so it is the same on any machine and any numpy version.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import numpy as np
import tensorflow as tf

from trainformer.data.tokenizer import Tokenizer, frame
from trainformer.tokens import MASK_ID, NUM_SPECIAL, PAD_ID

BUCKET_BATCHES = 20  # batches per chunk sorted by length: similar lengths, still a fresh mix per epoch
PAD_MULTIPLE = 16


def encode(tokenizer: Tokenizer, texts: list[str], seq_len: int, batch_size: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Texts -> `[CLS] pieces [SEP]` ids, cut to seq_len (the text's end is dropped, BERT's
    truncation), as (flat ids int32, lengths int32)."""
    pieces, lengths = [], []
    for start in range(0, len(texts), batch_size):
        ids, _ = frame(tokenizer(tf.constant(texts[start : start + batch_size])), seq_len)  # (batch, None)
        pieces.append(ids.flat_values.numpy())
        lengths.append(ids.row_lengths().numpy().astype(np.int32))
    if not pieces:
        return np.zeros([0], np.int32), np.zeros([0], np.int32)
    return np.concatenate(pieces), np.concatenate(lengths)


def cached_encode(cache_dir: Path, tokenizer: Tokenizer, texts: list[str], labels: list[int], fingerprint: str,
                  split: str, seq_len: int) -> tuple[dict[str, np.ndarray], bool]:
    """encode() with the labels, done once per (data, vocabulary, seq_len, split) and kept on
    disk (written then renamed: a crash never leaves half a cache), so eval needs no corpus.
    Returns ({"flat", "lengths", "labels"}, was_cached)."""
    path = cache_file(cache_dir, tokenizer, fingerprint, split, seq_len)
    if path.is_file():
        return load_cached(path), True
    flat, lengths = encode(tokenizer, texts, seq_len)
    arrays = {"flat": flat, "lengths": lengths, "labels": np.asarray(labels, np.int32)}
    save_arrays(path, arrays)
    return arrays, False


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An .npz written then renamed: a crash never leaves half a cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, **arrays)
    partial.replace(path)


def load_cached(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as cached:
        return {name: cached[name] for name in ("flat", "lengths", "labels")}


def cache_file(cache_dir: Path, tokenizer: Tokenizer, fingerprint: str, split: str, seq_len: int) -> Path:
    key = hashlib.sha256(f"{fingerprint}:{tokenizer.vocab_hash}:{split}:{seq_len}".encode()).hexdigest()[:16]
    return cache_dir / f"{split}-examples-{key}.npz"


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A well-mixed 64-bit hash of each uint64 (wrapping arithmetic is intended)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def permutation(n: int, *keys: int) -> np.ndarray:
    """A permutation of range(n) that is a pure function of keys."""
    x = np.arange(n, dtype=np.uint64)
    for key in keys:
        x = _splitmix64(x ^ _splitmix64(np.array([key], np.uint64)))
    return np.argsort(x, kind="stable")


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> np.ndarray:
    """The batches of one epoch, (batches, batch_size) example indices: a shuffled epoch, cut
    in chunks sorted by length, cut in batches, in shuffled batch order (the remainder is
    dropped, as for MLM)."""
    num_batches = len(lengths) // batch_size
    order = permutation(len(lengths), seed, epoch)[: num_batches * batch_size]
    chunk = batch_size * BUCKET_BATCHES
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        order[start : start + chunk] = part[np.argsort(lengths[part], kind="stable")]
    batches = order.reshape(num_batches, batch_size)
    return batches[permutation(num_batches, seed, epoch, 1)]


def batch_numbers(lengths: np.ndarray, batch_size: int, seed: int, start_batch: int) -> Iterator[np.ndarray]:
    """Batch start_batch, start_batch + 1, ... for ever (epoch after epoch)."""
    per_epoch = len(lengths) // batch_size
    epoch, offset = divmod(start_batch, per_epoch)
    while True:
        yield from epoch_batches(lengths, batch_size, seed, epoch)[offset:]
        epoch, offset = epoch + 1, 0


def gather_batch(ragged: tf.RaggedTensor, labels: tf.Tensor, indices: tf.Tensor, seq_len: int):
    """Rows `indices` padded to their longest (rounded up to PAD_MULTIPLE, at most seq_len):
    (inputs {token_ids, padding_mask} (batch, L), targets {labels (batch,)})."""
    rows = tf.gather(ragged, indices)  # (batch, None)
    longest = tf.cast(tf.reduce_max(rows.row_lengths()), tf.int64)
    width = tf.minimum((longest + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE, tf.constant(seq_len, tf.int64))
    ids = rows.to_tensor(default_value=PAD_ID, shape=tf.stack([tf.shape(indices, tf.int64)[0], width]))
    ids = tf.ensure_shape(ids, [indices.shape[0], None])  # a static batch: strategies split its rows
    return {"token_ids": ids, "padding_mask": ids != PAD_ID}, {"labels": tf.gather(labels, indices)}


def hide_tokens(ids: tf.Tensor, seed: tf.Tensor, rate: float) -> tf.Tensor:
    """(batch, L) ids with about `rate` of the text's tokens ([CLS], [SEP] and padding kept)
    replaced by [MASK], drawn from the stateless (2,) seed."""
    draw = tf.random.stateless_uniform(tf.shape(ids), seed)  # (batch, L)
    hidden = (draw < rate) & (ids >= NUM_SPECIAL)
    return tf.where(hidden, tf.constant(MASK_ID, ids.dtype), ids)


def train_dataset(examples: dict[str, np.ndarray], batch_size: int, seed: int, seq_len: int,
                  start_batch: int = 0, mask_rate: float = 0.0, twice: bool = False) -> tf.data.Dataset:
    """An endless stream of length-bucketed (inputs, targets) batches from batch start_batch on,
    from cached_encode's arrays; mask_rate > 0 hides that share of each batch's tokens (see
    hide_tokens), a draw that is a pure function of (seed, batch number) like the order. With
    examples["soft"] (examples, labels), the teachers' probabilities (train.distill_from), the
    targets carry each row's as "soft" (batch, labels) beside its label. twice (R-Drop): every
    text comes in two rows side by side, (2 batch, L), and the targets say so ("paired")."""
    lengths = examples["lengths"]
    if len(lengths) < batch_size:
        raise ValueError(f"{len(lengths)} training examples are fewer than one batch of {batch_size}")
    ragged = tf.RaggedTensor.from_row_lengths(examples["flat"], lengths)
    labels = tf.constant(examples["labels"], tf.int32)
    soft = tf.constant(examples["soft"], tf.float32) if "soft" in examples else None  # (examples, labels)
    batches = tf.data.Dataset.from_generator(
        lambda: batch_numbers(lengths, batch_size, seed, start_batch),
        output_signature=tf.TensorSpec([batch_size], tf.int64),
    )

    @tf.autograph.experimental.do_not_convert
    def batch(number: tf.Tensor, indices: tf.Tensor):
        if twice:
            indices = tf.repeat(indices, 2)  # (2 batch,): each text in two rows side by side
        inputs, targets = gather_batch(ragged, labels, indices, seq_len)
        if twice:
            targets = {**targets, "paired": tf.ones_like(indices, tf.bool)}  # rows 2i and 2i + 1: one text
        if soft is not None:
            targets = {**targets, "soft": tf.gather(soft, indices)}
        if mask_rate:
            mask_seed = tf.stack([tf.constant(seed + 1, tf.int64), number])
            inputs = {**inputs, "token_ids": hide_tokens(inputs["token_ids"], mask_seed, mask_rate)}
        return inputs, targets

    numbered = tf.data.Dataset.zip(tf.data.Dataset.counter(start_batch), batches)
    return numbered.map(batch).prefetch(tf.data.AUTOTUNE)


def eval_batches(examples: dict[str, np.ndarray], batch_size: int, seq_len: int) -> list[tuple[dict, dict]]:
    """Every example of a split once, in batches of similar length (sorted): fixed batches,
    so every eval of a run scores the same thing."""
    ragged = tf.RaggedTensor.from_row_lengths(examples["flat"], examples["lengths"])
    labels = tf.constant(examples["labels"], tf.int32)
    order = length_order(examples["lengths"])
    return [gather_batch(ragged, labels, tf.constant(order[start : start + batch_size]), seq_len)
            for start in range(0, len(order), batch_size)]


def length_order(lengths: np.ndarray) -> np.ndarray:
    """The order eval_batches reads examples in: shortest first."""
    return np.argsort(lengths, kind="stable")
