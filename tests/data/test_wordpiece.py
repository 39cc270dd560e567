"""The deterministic WordPiece trainer on hand-checked word counts (the real corpus, the
in-graph parity and byte-identical vocabularies across processes: test_tokenizer.py)."""

import json
import os
import random
import subprocess
import sys

from trainformer.data.wordpiece import count_words, learn_vocab, train_wordpiece

WORDS = {"low": 5, "lower": 2, "newest": 6, "widest": 3}


def test_alphabet_then_merges_in_the_order_learned():
    vocab = learn_vocab(WORDS, vocab_size=100, min_frequency=2, special_tokens=["[UNK]"])
    assert vocab[:11] == ["[UNK]", "d", "e", "i", "l", "n", "o", "r", "s", "t", "w"]  # by code point
    assert vocab[11:19] == ["##d", "##e", "##i", "##o", "##r", "##s", "##t", "##w"]
    # ##e+##s and ##s+##t both occur 9 times: the older pair (lower ids) wins the tie. Then
    # lo/##o##w (7 each) -> "lo"; n+##e, ##e+##w, ##w+##est (6 each) -> "ne" first.
    assert vocab[19:] == [
        "##es", "##est", "lo", "low", "ne", "##west", "newest", "wi", "##dest", "widest", "##er", "lower",
    ]


def test_merges_stop_at_min_frequency_and_vocab_size_but_the_alphabet_is_never_cut():
    assert learn_vocab(WORDS, 100, min_frequency=3, special_tokens=["[UNK]"])[19:] == [
        "##es", "##est", "lo", "low", "ne", "##west", "newest", "wi", "##dest", "widest",
    ]  # "##er" and "lower" occur twice
    assert learn_vocab(WORDS, 21, min_frequency=1, special_tokens=["[UNK]"])[19:] == ["##es", "##est"]
    assert len(learn_vocab(WORDS, 5, min_frequency=1, special_tokens=["[UNK]"])) == 19


def test_a_character_seen_once_is_kept():
    vocab = learn_vocab({"中": 1, "国": 1000, "ab": 1}, vocab_size=100, min_frequency=2, special_tokens=[])
    assert vocab == ["a", "b", "中", "国", "##b"]  # no pair reaches min_frequency: no merges


def test_repeated_symbols_merge_left_to_right():
    assert learn_vocab({"aaaa": 3}, 100, 1, ["[UNK]"]) == ["[UNK]", "a", "##a", "##aa", "aaa", "aaaa"]


def test_result_depends_only_on_the_counts():
    rng = random.Random(0)
    letters = "abcde"
    for _ in range(20):
        counts = {}
        for _ in range(40):
            word = "".join(rng.choice(letters) for _ in range(rng.randint(1, 7)))
            counts[word] = rng.randint(1, 9)
        vocab = learn_vocab(counts, 60, 2, ["[PAD]", "[UNK]"])
        shuffled = list(counts.items())
        rng.shuffle(shuffled)
        assert learn_vocab(dict(shuffled), 60, 2, ["[PAD]", "[UNK]"]) == vocab
        characters = {ch for word in counts for ch in word}
        continuations = {"##" + ch for word in counts for ch in word[1:]}
        assert len(set(vocab)) == len(vocab) <= max(60, 2 + len(characters) + len(continuations))
        assert characters | continuations <= set(vocab)


# train_wordpiece on texts from stdin; no TensorFlow import, so a process takes about a second.
TRAIN_IN_ANOTHER_PROCESS = """
import json, sys
from trainformer.data.wordpiece import train_wordpiece
print(json.dumps(train_wordpiece(json.load(sys.stdin), 5000, 2, True, ["[PAD]", "[UNK]"])))
"""


def test_the_vocabulary_does_not_depend_on_the_hash_seed(corpus):
    """Sets of strings iterate in PYTHONHASHSEED order, which is fixed within one process: only
    processes with other seeds show an order that leaked from a set (real paragraphs: thousands
    of characters, and digit and Latin pieces whose pairs tie)."""
    texts = corpus.train[:150]
    expected = train_wordpiece(texts, 5000, 2, True, ["[PAD]", "[UNK]"])
    assert sum(len(token.removeprefix("##")) > 1 for token in expected[2:]) > 10  # merges were learned too
    processes = [subprocess.Popen([sys.executable, "-c", TRAIN_IN_ANOTHER_PROCESS], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
                 for seed in ("1", "2")]
    for process in processes:
        out, _ = process.communicate(json.dumps(texts))
        assert process.returncode == 0 and json.loads(out) == expected


def test_count_words_counts_what_the_pre_tokenizer_splits():
    assert count_words(["a b a", "b c"], str.split) == {"a": 2, "b": 2, "c": 1}
