"""A standalone WordPiece tokenizer that gives exactly the ids of trainformer's in-graph one.

An exported TFLite model takes token ids: TFLite cannot run the tensorflow-text ops that turn
text into ids in the training and serving graphs. This one file does that step anywhere
Python 3.8+ runs, with the standard library only (it is copied into export directories as
`tokenizer.py`, next to `vocab.txt` and `tokenizer.json`):

    from tokenizer import WordPieceTokenizer
    tokenizer = WordPieceTokenizer.from_files(".")
    ids = tokenizer.encode("人民日报", max_length=128)     # [CLS] ... [SEP]

    echo "人民日报" | python tokenizer.py                   # [CLS] ... [SEP] ids of each line on stdin

It reproduces, id for id, `tf_text.normalize_utf8(text, "NFKC")` followed by tensorflow-text's
`FastBertTokenizer(vocab, unknown_token="[UNK]", lower_case_nfd_strip_accents=lowercase)`:

1. NFKC over the whole text.
2. Character by character (FastBertNormalizer maps each code point on its own): with
   lowercase, NFKC_Casefold, then NFD, then combining marks (category Mn) dropped; always,
   control and format characters (Cc, Cf) become spaces. So a zero-width joiner joins the
   words around it with lowercase (case folding drops default-ignorable characters) and
   splits them without.
3. Words: split on whitespace; every punctuation character (all ASCII symbols, Unicode P*)
   and every CJK ideograph is a word of its own. "[MASK]" in a text is "[", "mask", "]".
4. WordPiece on each word: greedy longest match first, "##" marking pieces inside a word. A
   word of more than 100 UTF-8 bytes, or one the vocabulary cannot cover, is one [UNK].

A word-aware vocabulary (tokenizer.json "words": true) differs in steps 3 and 4: a run of the
Chinese characters the vocabulary holds is one word and its pieces carry no "##" (a piece
inside the run is the token it is at a run's start); a Chinese character the vocabulary lacks
is a word of its own; no byte limit (1 MiB).

Characters that this Python's `unicodedata` does not know yet (assigned in a later Unicode
version than its own; tensorflow-text 2.21 uses Unicode 16, Python 3.11 knows Unicode 14) may
come out differently; every character Python knows gives the in-graph ids.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

VOCAB_FILE = "vocab.txt"
SETTINGS_FILE = "tokenizer.json"
PAD, UNK, CLS, SEP = "[PAD]", "[UNK]", "[CLS]", "[SEP]"
SUFFIX = "##"  # marks a piece that continues a word
MAX_BYTES_PER_WORD = 100  # FastWordpieceTokenizer's max_bytes_per_word: longer words are [UNK]
MAX_WORD_BYTES_WORD_AWARE = 1 << 20  # the same with a word-aware vocabulary

# BERT's `_is_chinese_char` blocks: each ideograph is a word of its own.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
# Unicode Default_Ignorable_Code_Point: NFKC_Casefold maps these to nothing.
DEFAULT_IGNORABLE = frozenset(
    code
    for low, high in (
        (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
        (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
        (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
    )
    for code in range(low, high + 1)
)


def is_punctuation(char: str) -> bool:
    """Punctuation as BERT (and tensorflow-text) sees it: every ASCII character that is not a
    letter, digit, space or control, and any Unicode P* character."""
    if char.isascii():
        return 33 <= ord(char) <= 126 and not char.isalnum()
    return unicodedata.category(char).startswith("P")


def is_chinese(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in CJK_RANGES)


def is_word_of_its_own(char: str) -> bool:
    """BERT's words of one character: punctuation and CJK ideographs."""
    return is_punctuation(char) or is_chinese(char)


def normalize_char(char: str, lowercase: bool) -> str:
    """What tensorflow-text's FastBertNormalizer makes of one code point.

    With lowercase it is NFKC_Casefold, NFD, then no Mn marks. NFKD + casefold + dropping the
    default ignorables gives the same result once NFD follows (NFKC's composing step is
    undone by NFD): measured equal on every code point Python's unicodedata knows.
    """
    if lowercase:
        folded = unicodedata.normalize("NFKD", char).casefold()
        folded = "".join(c for c in folded if ord(c) not in DEFAULT_IGNORABLE)
        char = "".join(c for c in unicodedata.normalize("NFD", folded) if unicodedata.category(c) != "Mn")
    return "".join(" " if unicodedata.category(c) in ("Cc", "Cf") else c for c in char)


class _CharMap(dict):
    """Code point -> its normalized text with spaces around each character that is_alone
    says is a word of its own, for `str.translate`: filled lazily, so each distinct character
    is worked out once."""

    def __init__(self, lowercase: bool, is_alone):
        super().__init__()
        self.lowercase = lowercase
        self.is_alone = is_alone

    def __missing__(self, code: int) -> str:
        normalized = normalize_char(chr(code), self.lowercase)
        self[code] = "".join(f" {c} " if self.is_alone(c) else c for c in normalized)
        return self[code]


class WordPieceTokenizer:
    """Text -> WordPiece ids, equal to trainformer's in-graph `Tokenizer` (tensorflow-text).

    Args:
        vocab: the WordPiece vocabulary, one token per id ("[PAD]", "[UNK]", "[CLS]", "[SEP]"
            among them).
        lowercase: lowercase and strip accents, as the vocabulary was trained.
        words: a word-aware vocabulary (see the module's docstring).

    Example:
        tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##able"])
        tokenizer.tokenize("Unable")  # [4, 5]
    """

    def __init__(self, vocab: List[str], lowercase: bool = True, words: bool = False):
        self.vocab = list(vocab)
        self.lowercase = lowercase
        self.word_aware = words
        self.ids = {token: i for i, token in enumerate(self.vocab)}
        if len(self.ids) != len(self.vocab):
            raise ValueError("the vocabulary holds a token twice")
        missing = [token for token in (PAD, UNK, CLS, SEP) if token not in self.ids]
        if missing:
            raise ValueError(f"the vocabulary lacks the special tokens {missing}")
        self.pad_id, self.unk_id, self.cls_id, self.sep_id = (self.ids[t] for t in (PAD, UNK, CLS, SEP))
        self._chars = _CharMap(lowercase, is_punctuation if words else is_word_of_its_own)
        if words:  # runs of known Chinese characters, an unknown one alone, anything else
            known = "".join(t for t in self.vocab if len(t) == 1 and is_chinese(t))
            chinese = "".join(f"{chr(low)}-{chr(high)}" for low, high in CJK_RANGES)
            self._runs = re.compile((f"[{known}]+|" if known else "") + f"[{chinese}]|[^{chinese}]+")
        self._longest = max(len(token) for token in self.vocab)  # no longer piece can match
        self._word_ids = lru_cache(maxsize=1 << 16)(self._wordpiece)

    @classmethod
    def from_files(cls, folder) -> "WordPieceTokenizer":
        """The tokenizer saved in folder: vocab.txt and tokenizer.json ({"lowercase": ...}),
        as in a run's tokenizer/ directory or an export directory."""
        folder = Path(folder)
        for name in (VOCAB_FILE, SETTINGS_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder / name}: no such file (the tokenizer needs {VOCAB_FILE} and {SETTINGS_FILE})")
        settings = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
        if not isinstance(settings.get("lowercase"), bool):
            raise ValueError(f"{folder / SETTINGS_FILE}: needs \"lowercase\": true or false")
        if settings.get("normalization", "NFKC") != "NFKC":
            raise ValueError(f"{folder / SETTINGS_FILE}: normalization {settings['normalization']!r} is not NFKC")
        if not isinstance(settings.get("words", False), bool):
            raise ValueError(f"{folder / SETTINGS_FILE}: \"words\" must be true or false")
        vocab = (folder / VOCAB_FILE).read_text(encoding="utf-8").splitlines()
        return cls(vocab, lowercase=settings["lowercase"], words=settings.get("words", False))

    def words(self, text: str) -> List[str]:
        """The words WordPiece splits: normalized, cut at whitespace and around punctuation
        (and, word-aware, around each run of Chinese characters).

        str.split() cuts at Unicode White_Space and at U+001C..U+001F, which are control
        characters and so already spaces here: the same cuts as tensorflow-text's.
        """
        spaced = unicodedata.normalize("NFKC", text).translate(self._chars).split()
        if not self.word_aware:
            return spaced
        return [run for chunk in spaced for run in self._runs.findall(chunk)]

    def tokenize(self, text: str) -> List[int]:
        """WordPiece ids of text, no special tokens added."""
        ids: List[int] = []
        for word in self.words(text):
            ids.extend(self._word_ids(word))
        return ids

    def encode(self, text: str, max_length: Optional[int] = None) -> List[int]:
        """[CLS] ids [SEP], as the model reads a text; with max_length the ids are cut to
        max_length - 2 (the text's end is dropped)."""
        return self._encode(text, max_length)[0]

    def encode_batch(self, texts: Iterable[str], max_length: int) -> Tuple[List[List[int]], List[bool]]:
        """encode() each text; rows padded with [PAD] to the longest row, and whether each
        text was cut."""
        encoded = [self._encode(text, max_length) for text in texts]
        width = max((len(ids) for ids, _ in encoded), default=0)
        rows = [ids + [self.pad_id] * (width - len(ids)) for ids, _ in encoded]
        return rows, [truncated for _, truncated in encoded]

    def _encode(self, text: str, max_length: Optional[int]) -> Tuple[List[int], bool]:
        if max_length is not None and max_length < 2:
            raise ValueError(f"max_length must hold [CLS] and [SEP] (at least 2), got {max_length}")
        ids = self.tokenize(text)
        kept = ids if max_length is None else ids[: max_length - 2]
        return [self.cls_id, *kept, self.sep_id], len(kept) < len(ids)

    def _wordpiece(self, word: str) -> Tuple[int, ...]:
        """Greedy longest-match-first pieces of one word; [UNK] for the whole word when it is
        too long or some part of it matches no piece."""
        if len(word.encode("utf-8")) > (MAX_WORD_BYTES_WORD_AWARE if self.word_aware else MAX_BYTES_PER_WORD):
            return (self.unk_id,)
        joined = self.word_aware and is_chinese(word[0])  # a Chinese run: no "##" inside
        pieces = []
        start = 0
        while start < len(word):
            prefix = SUFFIX if start and not joined else ""
            for end in range(min(len(word), start + self._longest), start, -1):
                piece = self.ids.get(prefix + word[start:end])
                if piece is not None:
                    pieces.append(piece)
                    start = end
                    break
            else:
                return (self.unk_id,)
        return tuple(pieces)


def main(argv=None) -> int:
    """Print the ids of each line on stdin, space-separated, one line per line: [CLS] ... [SEP]
    as the model reads them (the exported models take exactly these), or the bare pieces."""
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description="WordPiece ids of each line on stdin.")
    parser.add_argument("folder", nargs="?", default=str(here), help=f"holds {VOCAB_FILE} and {SETTINGS_FILE} (default: {here})")
    parser.add_argument("--max-length", type=int, help="cut each line to this many ids, [CLS] and [SEP] included")
    parser.add_argument("--no-special-tokens", action="store_true",
                        help="the WordPiece ids only, without [CLS] and [SEP] (and not cut)")
    args = parser.parse_args(argv)
    try:
        tokenizer = WordPieceTokenizer.from_files(args.folder)
        if args.max_length is not None and args.max_length < 2:
            raise ValueError(f"--max-length must be at least 2, got {args.max_length}")
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        print(f"tokenizer: error: {error}", file=sys.stderr)
        return 2
    sys.stdin.reconfigure(encoding="utf-8", errors="replace")  # vocab.txt is UTF-8 too, whatever the locale
    for line in sys.stdin:
        text = line.rstrip("\n")
        ids = tokenizer.tokenize(text) if args.no_special_tokens else tokenizer.encode(text, args.max_length)
        print(" ".join(map(str, ids)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
