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

from trainformer.data.wordpiece import CJK_RANGES, MAX_WORD_BYTES, PREFIX, is_chinese, train_wordpiece
from trainformer.errors import UserError
from trainformer.files import write_atomic
from trainformer.tokens import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID  # noqa: F401 (re-read by data/)

VOCAB_FILE = "vocab.txt"
# What is written without spaces around it (RE2): anything but a letter or digit, and the
# letters of scripts written without spaces (Chinese, Japanese kana).
UNSPACED = r"[^\pL\pN]|[\p{Han}\p{Hiragana}\p{Katakana}]"
SETTINGS_FILE = "tokenizer.json"
# Word-aware mode's words (RE2), after FastBertNormalizer: cut at whitespace; kept as words of
# their own: BERT's punctuation (every ASCII symbol, Unicode P*), a run of known Chinese
# characters (the vocabulary's; set per vocabulary), and any other Chinese character alone.
WHITESPACE = r"[\s\p{Z}]+"
PUNCTUATION = r"[!-/:-@\[-`{-~]|\pP"
CHINESE = "".join(f"\\x{{{low:X}}}-\\x{{{high:X}}}" for low, high in CJK_RANGES)


def train_vocab(
    texts: Iterable[str], out_dir: Path, vocab_size: int, min_frequency: int, lowercase: bool, words: bool = False
) -> Path:
    """Learn a WordPiece vocabulary and write vocab.txt (+ settings) into out_dir.

    Deterministic: the same texts and settings give a byte-identical vocab.txt in any process.
    Every character of the texts is kept (on Chinese text, a cut alphabet would turn rare
    characters into [UNK]); then the most frequent pairs are merged until vocab_size tokens or
    no pair is seen min_frequency times (data/wordpiece.py). words=True: word-aware (runs of
    Chinese characters are words, their pieces without "##").
    """
    vocab = train_wordpiece(texts, vocab_size, min_frequency, lowercase, SPECIAL_TOKENS, words)
    return _write_vocab(out_dir, vocab, lowercase, words)


def copy_vocab(vocab_file: str, out_dir: Path, lowercase: bool, words: bool = False) -> Path:
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
    return _write_vocab(out_dir, vocab, lowercase, words)


def read_settings(folder: Path) -> dict:
    """tokenizer.json: {"lowercase": bool, "words": bool, ...} ("words" absent: false, as
    written before word-aware vocabularies)."""
    return {"words": False, **json.loads(Path(folder, SETTINGS_FILE).read_text())}


def _write_vocab(out_dir: Path, vocab: list[str], lowercase: bool, words: bool = False) -> Path:
    """Settings first, then vocab.txt, each atomically: a run dir whose vocab.txt exists has a
    complete tokenizer (a crash in between leaves none, and the next attempt makes it again)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = {"lowercase": lowercase, "words": words, "normalization": "NFKC", "special_tokens": SPECIAL_TOKENS}
    write_atomic(out_dir / SETTINGS_FILE, json.dumps(settings, indent=2))
    write_atomic(out_dir / VOCAB_FILE, "".join(f"{token}\n" for token in vocab))
    return out_dir / VOCAB_FILE


def known_chinese(vocab: list[str]) -> str:
    """The Chinese characters vocab holds as tokens, as an RE2 character class body (ranges
    of consecutive code points: a short pattern)."""
    codes = sorted(ord(token) for token in vocab if len(token) == 1 and is_chinese(token))
    ranges: list[list[int]] = []
    for code in codes:
        if ranges and code == ranges[-1][1] + 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return "".join(f"\\x{{{low:X}}}-\\x{{{high:X}}}" for low, high in ranges)


def word_aware_pieces(vocab: list[str]) -> tuple[list[str], tf.Tensor]:
    """WordPiece pieces for word-aware mode, and each piece's token id.

    tensorflow-text marks every piece after a word's first with "##"; inside a Chinese run
    that piece is the same token as at its start. So each Chinese token t is also a piece
    "##t", which maps to t's id: the model's vocabulary stays one token per word.
    """
    continued = [i for i, token in enumerate(vocab) if is_chinese(token[0])]
    pieces = vocab + [PREFIX + vocab[i] for i in continued]
    return pieces, tf.constant(list(range(len(vocab))) + continued, tf.int32)


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
        words: a word-aware vocabulary (tokenizer.words): a run of Chinese characters is one
            word, split greedily longest-match-first into the vocabulary's pieces (its
            multi-character words), a Chinese character it does not hold is [UNK] alone.

    Example:
        tokenizer = Tokenizer.load(run_dir / "tokenizer")
        ids = tokenizer(tf.constant(["人民日报"]))  # RaggedTensor (batch, None) int32
    """

    def __init__(self, vocab: list[str], lowercase: bool = True, words: bool = False):
        super().__init__(name="tokenizer")
        if tuple(vocab[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"vocabulary must start with {SPECIAL_TOKENS}, got {vocab[:5]}")
        self.vocab = vocab
        self.lowercase = lowercase
        self.words = words
        self._pieces = tf.constant(vocab)  # id -> piece, for text()
        if words:
            self._normalizer = tf_text.FastBertNormalizer(lower_case_nfd_strip_accents=lowercase)
            known = known_chinese(vocab)
            self._kept_words = (f"[{known}]+|" if known else "") + f"[{CHINESE}]|{PUNCTUATION}"
            self._word_cuts = f"{WHITESPACE}|{self._kept_words}"  # what regex_split cuts at
            pieces, self._piece_ids = word_aware_pieces(vocab)
            self._wordpiece = tf_text.FastWordpieceTokenizer(
                pieces, token_out_type=tf.int32, unknown_token="[UNK]", no_pretokenization=True,
                max_bytes_per_word=MAX_WORD_BYTES,
            )
        else:
            self._wordpiece = tf_text.FastBertTokenizer(
                vocab, token_out_type=tf.int32, unknown_token="[UNK]", lower_case_nfd_strip_accents=lowercase
            )

    @classmethod
    def load(cls, folder: Path) -> "Tokenizer":
        vocab = Path(folder, VOCAB_FILE).read_text(encoding="utf-8").splitlines()
        settings = read_settings(folder)
        return cls(vocab, lowercase=settings["lowercase"], words=settings["words"])

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def vocab_hash(self) -> str:
        """sha256 of the vocabulary (and of word-aware mode, which splits differently): part of
        every token cache key (new ids, new cache)."""
        return hashlib.sha256(("\n".join(self.vocab) + ("\n[words]" if self.words else "")).encode("utf-8")).hexdigest()

    def __call__(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """(batch,) strings -> (batch, None) int32 ids, no special tokens added."""
        texts = tf_text.normalize_utf8(texts, "NFKC")
        if not self.words:
            return self._wordpiece.tokenize(texts)
        words = tf_text.regex_split(self._normalizer.normalize(texts), self._word_cuts, self._kept_words)  # (batch, words)
        pieces = self._wordpiece.tokenize(words).merge_dims(1, 2)  # (batch, None) ids of `pieces`
        return pieces.with_flat_values(tf.gather(self._piece_ids, pieces.flat_values))

    def tokenize_with_offsets(self, normalized: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor, tf.RaggedTensor]:
        """(batch,) NFKC-normalized strings -> the ids __call__ gives (NFKC twice is NFKC once),
        and each token's start and end byte in its string: three (batch, None) ragged tensors."""
        if self.words:
            raise ValueError("token offsets are for a vocabulary of pieces (tokenizer.words: false)")
        return self._wordpiece.tokenize_with_offsets(normalized)

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
