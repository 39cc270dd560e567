"""Exact and near-duplicate detection for a mixed corpus, with numpy and the standard library.

Exact duplicates are equal after `normal_form` (NFKC, so full-width and half-width digits and
Latin letters agree, and whitespace runs made one space). Near duplicates are found with MinHash
over character 5-gram shingles and LSH banding (Broder 1997; Leskovec et al., Mining of Massive
Datasets ch. 3), then confirmed with the exact Jaccard similarity of the two shingle sets:

- each shingle is hashed with a polynomial rolling hash over its code points, computed for every
  position of every document at once in numpy, and scrambled by splitmix64's finalizer;
- a document's signature is, for each of NUM_PERMUTATIONS hash functions x -> a*x + b (mod 2**64,
  a odd), the least hash of its shingles;
- signatures are cut into BANDS bands of ROWS rows: two documents are candidates when they agree
  on a whole band. With 16 bands of 6 rows, a pair of Jaccard 0.8 becomes a candidate with
  probability 1 - (1 - 0.8**6)**16 = 0.99, one of 0.5 with 0.22, one of 0.3 with 0.01;
- a candidate pair is a near duplicate when the exact Jaccard of the shingle sets is >= THRESHOLD.

Documents are taken in order: one is dropped when it is near an earlier kept one, so the caller
decides who wins by the order it gives (corpus.py puts held-out texts first).
"""

from __future__ import annotations

import unicodedata

import numpy as np

SHINGLE = 5  # characters: a Chinese word is 1-4, so 5-grams span word boundaries
NUM_PERMUTATIONS = 96
BANDS, ROWS = 16, 6  # BANDS * ROWS == NUM_PERMUTATIONS
THRESHOLD = 0.8  # Jaccard similarity of the 5-gram sets
CONTAINED = 0.5  # the share of a text's 5-grams found in the references that makes it part of them
CHUNK_CHARACTERS = 1 << 21  # documents are hashed in chunks of about this many characters (memory)
SEED = 20240601  # fixes the hash functions: the same corpus always loses the same documents
MULTIPLIER = np.uint64(0x100000001B3)  # the rolling hash's base (FNV-1a's 64-bit prime)


def normal_form(text: str) -> str:
    """What two texts must share to be exact duplicates: NFKC, whitespace runs made one space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def near_duplicates(texts: list[str]) -> list[bool]:
    """For each text (each at least SHINGLE characters long), whether it is a near duplicate of an
    earlier text that was kept (Jaccard of their 5-gram sets >= THRESHOLD)."""
    if any(len(text) < SHINGLE for text in texts):
        raise ValueError(f"near_duplicates needs texts of {SHINGLE}+ characters")
    buckets_of = shared_buckets(band_keys(minhash_signatures(texts)))
    shingle_sets: dict[int, set[str]] = {}
    duplicate = [False] * len(texts)
    for index in sorted(buckets_of):  # a text that shares no bucket is no one's candidate: kept
        candidates = {other for bucket in buckets_of[index] for other in bucket
                      if other < index and not duplicate[other]}
        duplicate[index] = any(jaccard(texts, index, other, shingle_sets) >= THRESHOLD for other in sorted(candidates))
    return duplicate


def contained(texts: list[str], references: list[str]) -> list[bool]:
    """For each text, whether CONTAINED or more of its 5-grams occur in the references: a paragraph
    of a longer reference is no near duplicate of it (their Jaccard is small) but is inside it.
    A text shorter than SHINGLE has no 5-grams and is never inside."""
    pool = set().union(*map(shingles, references))
    inside = []
    for text in texts:
        own = shingles(text)
        inside.append(bool(own) and len(own & pool) >= CONTAINED * len(own))
    return inside


def shared_buckets(keys: np.ndarray) -> dict[int, list[list[int]]]:
    """text -> the buckets (texts agreeing on one band, ascending) it shares with others. Found in
    numpy: most texts share none, and a Python loop over all of them would dominate the time."""
    buckets_of: dict[int, list[list[int]]] = {}
    for band in range(keys.shape[1]):
        _, bucket, sizes = np.unique(keys[:, band], return_inverse=True, return_counts=True)
        shared = np.flatnonzero(sizes[bucket] > 1)
        shared = shared[np.argsort(bucket[shared], kind="stable")]  # grouped by bucket, ascending inside
        bounds = np.flatnonzero(np.diff(bucket[shared])) + 1
        for members in np.split(shared, bounds) if len(shared) else []:
            members = members.tolist()
            for member in members:
                buckets_of.setdefault(member, []).append(members)
    return buckets_of


def jaccard(texts: list[str], first: int, second: int, shingle_sets: dict[int, set[str]]) -> float:
    """Exact Jaccard similarity of two texts' shingle sets (computed once per text, when needed)."""
    a, b = (shingle_sets.get(i) or shingle_sets.setdefault(i, shingles(texts[i])) for i in (first, second))
    return len(a & b) / len(a | b)


def shingles(text: str) -> set[str]:
    return {text[i:i + SHINGLE] for i in range(len(text) - SHINGLE + 1)}


def minhash_signatures(texts: list[str]) -> np.ndarray:
    """(len(texts), NUM_PERMUTATIONS) uint64 MinHash signatures, hashed chunk by chunk."""
    multipliers, offsets = hash_functions()
    signatures = np.empty((len(texts), NUM_PERMUTATIONS), dtype=np.uint64)
    start = 0
    while start < len(texts):
        end, characters = start, 0
        while end < len(texts) and (end == start or characters + len(texts[end]) <= CHUNK_CHARACTERS):
            characters += len(texts[end])
            end += 1
        hashes, segment_starts = shingle_hashes(texts[start:end])
        for column, (a, b) in enumerate(zip(multipliers, offsets)):
            signatures[start:end, column] = np.minimum.reduceat(hashes * a + b, segment_starts)
        start = end
    return signatures


def hash_functions() -> tuple[np.ndarray, np.ndarray]:
    """NUM_PERMUTATIONS fixed (odd multiplier, offset) pairs."""
    random = np.random.default_rng(SEED)
    multipliers = random.integers(0, 2**63, NUM_PERMUTATIONS, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    offsets = random.integers(0, 2**63, NUM_PERMUTATIONS, dtype=np.uint64)
    return multipliers, offsets


def shingle_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The scrambled hash of every 5-gram of every text, the texts one after another, and where
    each text's hashes start."""
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    count = len(codes) - SHINGLE + 1
    hashes = codes[:count].copy()
    for offset in range(1, SHINGLE):
        hashes *= MULTIPLIER
        hashes += codes[offset:offset + count]
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(lengths)
    inside = np.ones(count, dtype=bool)  # a shingle that starts in one text and ends in the next is none
    for tail in range(1, SHINGLE):
        crossing = ends - SHINGLE + tail
        inside[crossing[crossing < count]] = False
    per_text = lengths - SHINGLE + 1
    segment_starts = np.concatenate([[0], np.cumsum(per_text)[:-1]])
    return scramble(hashes[inside]), segment_starts


def scramble(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every output bit depends on every input bit."""
    x = x ^ (x >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def band_keys(signatures: np.ndarray) -> np.ndarray:
    """(documents, BANDS) uint64: one hash of each band's ROWS signature values."""
    bands = signatures.reshape(len(signatures), BANDS, ROWS)
    keys = bands[:, :, 0].copy()
    for row in range(1, ROWS):
        keys *= MULTIPLIER
        keys ^= bands[:, :, row]
    return scramble(keys)
