"""WordPiece vocabulary: learned deterministically (data/wordpiece.py), run in-graph with
tensorflow-text.

The training data path and the serving graph use the same in-graph tokenizer
(`FastBertTokenizer` after NFKC), so what the model saw in training is exactly what it sees
in serving. The HF `tokenizers` BERT tokenizer (`hf_wordpiece`) splits words for vocabulary
training and is the reference: a test proves both give the same ids on the whole valid split.
HF's own WordPiece trainer is not used: it is not deterministic (huggingface/tokenizers#1794).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

import tensorflow as tf
import tensorflow_text as tf_text

from trainformer.data.wordpiece import train_wordpiece
from trainformer.errors import UserError
from trainformer.files import write_atomic
from trainformer.tokens import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID  # noqa: F401 (re-read by data/)

VOCAB_FILE = "vocab.txt"
# What is written without spaces around it (RE2): anything but a letter or digit, and the
# letters of scripts written without spaces (Chinese, Japanese kana).
UNSPACED = r"[^\pL\pN]|[\p{Han}\p{Hiragana}\p{Katakana}]"
SETTINGS_FILE = "tokenizer.json"


def train_vocab(
    texts: Iterable[str], out_dir: Path, vocab_size: int, min_frequency: int, lowercase: bool
) -> Path:
    """Learn a WordPiece vocabulary and write vocab.txt (+ settings) into out_dir.

    Deterministic: the same texts and settings give a byte-identical vocab.txt in any process.
    Every character of the texts is kept (on Chinese text, a cut alphabet would turn rare
    characters into [UNK]); then the most frequent pairs are merged until vocab_size tokens or
    no pair is seen min_frequency times (data/wordpiece.py).
    """
    vocab = train_wordpiece(texts, vocab_size, min_frequency, lowercase, SPECIAL_TOKENS)
    return _write_vocab(out_dir, vocab, lowercase)


def copy_vocab(vocab_file: str, out_dir: Path, lowercase: bool) -> Path:
    """Use an existing vocab.txt instead of training one (e.g. bert-base-chinese's, or one
    vocabulary for runs on different corpora)."""
    source = Path(vocab_file).expanduser()
    if not source.is_file():
        raise UserError(f"tokenizer.vocab_file: {source}: no such file")
    vocab = source.read_text(encoding="utf-8").splitlines()
    for line, (token, expected) in enumerate(zip(vocab, SPECIAL_TOKENS), start=1):
        if token != expected:
            raise UserError(f"{source}:{line}: expected special token {expected}, found {token!r}")
    if len(vocab) <= len(SPECIAL_TOKENS):
        raise UserError(f"{source}: holds no tokens beyond the special tokens")
    return _write_vocab(out_dir, vocab, lowercase)


def _write_vocab(out_dir: Path, vocab: list[str], lowercase: bool) -> Path:
    """Settings first, then vocab.txt, each atomically: a run dir whose vocab.txt exists has a
    complete tokenizer (a crash in between leaves none, and the next attempt makes it again)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = {"lowercase": lowercase, "normalization": "NFKC", "special_tokens": SPECIAL_TOKENS}
    write_atomic(out_dir / SETTINGS_FILE, json.dumps(settings, indent=2))
    write_atomic(out_dir / VOCAB_FILE, "".join(f"{token}\n" for token in vocab))
    return out_dir / VOCAB_FILE


def frame(ids: tf.RaggedTensor, seq_len: int) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """(batch, None) ids -> `[CLS] ids [SEP]` cut to seq_len (the text's end is dropped, BERT's
    truncation), and whether each row was cut: (batch,) bool."""
    rows = ids.nrows()
    truncated = ids.row_lengths() > seq_len - 2
    framed = tf.concat([tf.fill([rows, 1], CLS_ID), ids[:, : seq_len - 2], tf.fill([rows, 1], SEP_ID)], axis=1)
    return framed, truncated


class Tokenizer(tf.Module):
    """In-graph WordPiece tokenizer for training input and serving.

    Args:
        vocab: the WordPiece vocabulary, special tokens first (see SPECIAL_TOKENS).
        lowercase: lowercase and strip accents, as the vocabulary was trained.

    Example:
        tokenizer = Tokenizer.load(run_dir / "tokenizer")
        ids = tokenizer(tf.constant(["人民日报"]))  # RaggedTensor (batch, None) int32
    """

    def __init__(self, vocab: list[str], lowercase: bool = True):
        super().__init__(name="tokenizer")
        if tuple(vocab[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"vocabulary must start with {SPECIAL_TOKENS}, got {vocab[:5]}")
        self.vocab = vocab
        self.lowercase = lowercase
        self._pieces = tf.constant(vocab)  # id -> piece, for text()
        self._wordpiece = tf_text.FastBertTokenizer(
            vocab, token_out_type=tf.int32, unknown_token="[UNK]", lower_case_nfd_strip_accents=lowercase
        )

    @classmethod
    def load(cls, folder: Path) -> "Tokenizer":
        vocab = Path(folder, VOCAB_FILE).read_text(encoding="utf-8").splitlines()
        settings = json.loads(Path(folder, SETTINGS_FILE).read_text())
        return cls(vocab, lowercase=settings["lowercase"])

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def vocab_hash(self) -> str:
        """sha256 of the vocabulary: part of every token cache key (new ids, new cache)."""
        return hashlib.sha256("\n".join(self.vocab).encode("utf-8")).hexdigest()

    def __call__(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """(batch,) strings -> (batch, None) int32 ids, no special tokens added."""
        return self._wordpiece.tokenize(tf_text.normalize_utf8(texts, "NFKC"))

    def detokenize(self, ids) -> list[str]:
        return [self.vocab[i] for i in ids]

    def text(self, ids: tf.Tensor) -> tf.Tensor:
        """(batch, L) int32 ids -> (batch,) strings, in-graph: special tokens ([UNK] aside) left
        out, `##` pieces joined to the word before, a space only between two words of a spaced
        script ("open the file", "25%", "在Windows中", "日、德"). The tokenizer split off every
        punctuation mark and CJK character, so which spaces the text had there is not known;
        none reads right in Chinese and costs nothing in BLEU (its tokenizers split them too)."""
        keep = (ids >= len(SPECIAL_TOKENS)) | (ids == UNK_ID)
        pieces = tf.ragged.boolean_mask(tf.gather(self._pieces, ids), keep)  # (batch, None)
        text = tf.strings.regex_replace(tf.strings.reduce_join(pieces, axis=-1, separator=" "), " ##", "")
        text = tf.strings.regex_replace(text, f"({UNSPACED}) ", r"\1")
        return tf.strings.regex_replace(text, f" ({UNSPACED})", r"\1")
