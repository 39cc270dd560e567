"""Whole-word masking for Chinese (data.whole_words): which tokens of the stream start a word.

With one token per Chinese character, a masked character is mostly given away by the rest of
its word ("不[MASK]" -> 错): the masked LM learns collocations, little of the context.
Whole-word masking (Cui et al. 2019, "Pre-Training with Whole Word Masking for Chinese BERT")
masks every character of a word together, so a word is guessed from its sentence. Words come
from jieba's segmentation of the normalized text (dictionary + HMM: deterministic); the
vocabulary, the model and what a fine-tune or an export reads do not change.

The output is a bool stream beside pipeline.tokenize_documents' token stream: True where a
token starts a word (the document's [SEP] starts one of its own). A token starts a word when
its first byte is where jieba starts one; the pieces of a word that WordPiece cuts ("x200" ->
"x", "##200") follow the word's first.
"""

from __future__ import annotations

import logging
from importlib.metadata import version

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from trainformer.data.tokenizer import Tokenizer

SEGMENTER = f"jieba {version('jieba')}"  # part of the cache key: another segmenter, other words


def segment(text: str) -> list[str]:
    """text -> its words, jieba's accurate mode (new words by its HMM), concatenating to text."""
    import jieba  # only whole-word runs pay its import and dictionary load (~1 s)

    jieba.setLogLevel(logging.WARNING)
    return list(jieba.cut(text, HMM=True))


def word_start_bytes(text: str) -> set[int]:
    """The UTF-8 byte offsets at which a word of text starts."""
    starts, offset = set(), 0
    for word in segment(text):
        starts.add(offset)
        offset += len(word.encode("utf-8"))
    return starts


def word_starts(tokenizer: Tokenizer, documents: list[str], batch_size: int = 2048) -> np.ndarray:
    """(tokens,) bool, aligned with tokenize_documents(tokenizer, documents): whether each token
    starts a word (module docstring)."""
    pieces = []
    for start in range(0, len(documents), batch_size):
        texts = tf_text.normalize_utf8(tf.constant(documents[start : start + batch_size]), "NFKC")
        _, token_starts, _ = tokenizer.tokenize_with_offsets(texts)  # (batch, None) byte offsets
        for text, offsets in zip(texts.numpy(), token_starts.to_list()):
            starts = word_start_bytes(text.decode("utf-8"))
            pieces.append(np.array([offset in starts for offset in offsets] + [True], bool))  # + its [SEP]
    return np.concatenate(pieces) if pieces else np.zeros([0], bool)
