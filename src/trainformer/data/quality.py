"""A character-level quality filter for a mixed pretraining corpus.

Cramming (Geiping & Goldstein 2022) drops the text its tokenizer compresses badly (many tokens
per character): code, tables, number lists, mangled markup. Our vocabulary is trained after the
corpus is read, so the filter cannot ask the tokenizer. It asks the characters instead: a BERT
WordPiece vocabulary for Chinese gives each Han character one token but breaks digits, symbols,
markup and rare Latin words into many, so a document of few Han characters is one the vocabulary
would compress badly, or one that is not Chinese text at all (the untranslated English pages of
a help set). Each rule gives the reason a document is dropped; corpus.py counts the reasons.
"""

from __future__ import annotations

import re

MIN_CHARACTERS = 5  # non-space characters: shorter is a heading, a label, a table cell
MIN_LETTER_SHARE = 0.5  # letters (any script) among non-space characters
MIN_HAN_SHARE = 0.3  # Han characters among non-space characters
# CJK Unified Ideographs and extension A, compatibility ideographs, extensions B-F (the planes past BMP)
HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef]")
LETTER = re.compile(r"[^\W\d_]")  # a word character that is no digit: letters of any script (and ① Ⅷ)

TOO_SHORT = "too short (quality)"
NOT_WORDS = "mostly digits, punctuation or symbols (quality)"
FEW_HAN = "few Han characters (quality)"


def quality_problem(text: str) -> str | None:
    """Why a document is dropped from a mixed corpus, or None to keep it."""
    characters = len("".join(text.split()))
    if characters < MIN_CHARACTERS:
        return TOO_SHORT
    if count(LETTER, text) < MIN_LETTER_SHARE * characters:
        return NOT_WORDS
    if count(HAN, text) < MIN_HAN_SHARE * characters:
        return FEW_HAN
    return None


def count(pattern: re.Pattern, text: str) -> int:
    """The characters of text that pattern matches (sub is a few times faster than findall here)."""
    return len(text) - len(pattern.sub("", text))
