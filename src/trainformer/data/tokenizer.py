"""WordPiece vocabulary: trained with HF `tokenizers`, run in-graph with tensorflow-text.

The training data path and the serving graph use the same in-graph tokenizer
(`FastBertTokenizer` after NFKC), so what the model saw in training is exactly what it sees
in serving. HF `tokenizers` is only used to learn the vocabulary; a test proves both give the
same ids on the whole valid split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import tensorflow as tf
import tensorflow_text as tf_text
from tokenizers import BertWordPieceTokenizer, normalizers

from trainformer.errors import UserError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
VOCAB_FILE = "vocab.txt"
SETTINGS_FILE = "tokenizer.json"


def hf_wordpiece(lowercase: bool, vocab: str | None = None) -> BertWordPieceTokenizer:
    """The vocab-training tokenizer: BERT pre-tokenization (CJK characters split singly),
    NFKC first so full-width digits and letters map onto their ASCII forms."""
    tokenizer = BertWordPieceTokenizer(
        vocab, clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), tokenizer.normalizer])
    return tokenizer


def train_vocab(
    texts: Iterable[str], out_dir: Path, vocab_size: int, min_frequency: int, lowercase: bool
) -> Path:
    """Learn a WordPiece vocabulary and write vocab.txt (+ settings) into out_dir."""
    tokenizer = hf_wordpiece(lowercase)
    tokenizer.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        # Keep every character seen min_frequency times. The default (1000) would turn most
        # Chinese characters into [UNK] (DESIGN.md, measured on People's Daily).
        limit_alphabet=1_000_000,
        special_tokens=list(SPECIAL_TOKENS),
        wordpieces_prefix="##",
        show_progress=False,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_model(str(out_dir))
    _write_settings(out_dir, lowercase)
    return out_dir / VOCAB_FILE


def copy_vocab(vocab_file: str, out_dir: Path, lowercase: bool) -> Path:
    """Use an existing vocab.txt instead of training one (e.g. to share a vocabulary between
    runs: HF WordPiece training is not deterministic, huggingface/tokenizers#1794)."""
    source = Path(vocab_file).expanduser()
    if not source.is_file():
        raise UserError(f"tokenizer.vocab_file: {source}: no such file")
    vocab = source.read_text(encoding="utf-8").splitlines()
    for line, (token, expected) in enumerate(zip(vocab, SPECIAL_TOKENS), start=1):
        if token != expected:
            raise UserError(f"{source}:{line}: expected special token {expected}, found {token!r}")
    if len(vocab) <= len(SPECIAL_TOKENS):
        raise UserError(f"{source}: holds no tokens beyond the special tokens")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / VOCAB_FILE).write_text("\n".join(vocab) + "\n", encoding="utf-8")
    _write_settings(out_dir, lowercase)
    return out_dir / VOCAB_FILE


def _write_settings(out_dir: Path, lowercase: bool) -> None:
    settings = {"lowercase": lowercase, "normalization": "NFKC", "special_tokens": SPECIAL_TOKENS}
    (out_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2))


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

    def __call__(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """(batch,) strings -> (batch, None) int32 ids, no special tokens added."""
        return self._wordpiece.tokenize(tf_text.normalize_utf8(texts, "NFKC"))

    def detokenize(self, ids) -> list[str]:
        return [self.vocab[i] for i in ids]
