"""A word-aware vocabulary (tokenizer.words): runs of Chinese characters are words split into
learned multi-character pieces without "##", the rest is BERT's. On hand-made vocabularies
whose pieces are known; the parity with the exported tokenizer on every character and on the
real reviews is in tests/export/test_wordpiece_tokenizer.py."""

import json

import tensorflow as tf

from trainformer.config import load_config
from trainformer.data.tokenizer import Tokenizer, copy_vocab, read_settings, train_vocab
from trainformer.data.wordpiece import is_chinese, learn_vocab, word_aware_split
from trainformer.tasks.vocabulary import run_vocabulary
from trainformer.tokens import SPECIAL_TOKENS, UNK_ID

VOCAB = [*SPECIAL_TOKENS, ",", "a", "b", "##b", "不", "好", "很", "手", "机", "错", "不错", "手机", "很好"]
ID = {token: i for i, token in enumerate(VOCAB)}


def ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return tokenizer(tf.constant(texts)).to_list()


def test_runs_merge_into_pieces_without_prefix():
    counts = {"手机不错": 3, "不错": 2, "ab": 2}
    vocab = learn_vocab(counts, 100, min_frequency=2, special_tokens=["[UNK]"], joined=lambda w: is_chinese(w[0]))
    # The alphabet by code point; "##" only for a character inside a word that is not a run.
    # 不错 (5) first; then 手机 and 机不错 tie at 3 and the older pair (手, 机) wins.
    assert vocab == ["[UNK]", "a", "b", "不", "手", "机", "错", "##b", "不错", "手机", "手机不错", "ab"]


def test_training_splits_runs_apart_from_other_words():
    assert word_aware_split(lowercase=True)("在Windows中打开，好 手机") == ["在", "windows", "中打开", ",", "好", "手机"]


def test_a_piece_inside_a_run_is_the_token_at_a_run_start():
    tokenizer = Tokenizer(VOCAB, words=True)
    assert ids(tokenizer, ["手机很好", "很好手机不错", "手机ab很好,a"]) == [
        [ID["手机"], ID["很好"]],
        [ID["很好"], ID["手机"], ID["不错"]],
        [ID["手机"], ID["a"], ID["##b"], ID["很好"], ID[","], ID["a"]],
    ]
    assert ids(Tokenizer(VOCAB), ["手机"]) == [[ID["手"], ID["机"]]]  # BERT's: one per character


def test_a_character_outside_the_vocabulary_is_unknown_alone():
    """Not the whole run: 坏 is [UNK], its neighbours keep their pieces."""
    assert ids(Tokenizer(VOCAB, words=True), ["手机坏不错"]) == [[ID["手机"], UNK_ID, ID["不错"]]]


def test_without_chinese_it_is_berts_tokenization(tokenizer):
    texts = ["The quick brown fox, jumps!", "HeLLo café [MASK] U.S.A. 25%", "tabs\tand\u3000spaces\u00a0x", "a\x00b"]
    assert ids(Tokenizer(tokenizer.vocab, words=True), texts) == ids(tokenizer, texts)
    english = [token for token in tokenizer.vocab if not any(is_chinese(ch) for ch in token)]
    assert ids(Tokenizer(english, words=True), texts + ["中"]) == ids(Tokenizer(english), texts + ["中"])


def test_text_reads_runs_back(tmp_path):
    tokenizer = Tokenizer(VOCAB, words=True)
    framed = tf.constant([[2, ID["手机"], ID["很好"], ID[","], ID["不错"], 3, 0]])
    assert tokenizer.text(framed).numpy()[0].decode() == "手机很好,不错"
    assert tokenizer.vocab_hash != Tokenizer(VOCAB).vocab_hash  # other ids for the same text: other caches


def test_the_setting_travels_with_the_vocabulary(tmp_path):
    """Written beside vocab.txt, read back by load, and taken by a fine-tune from model.init_from
    even though the fine-tune's own config leaves tokenizer.words false."""
    source = tmp_path / "pretrained"
    train_vocab(["这个手机很好用", "手机不错", "很好很好"] * 3, source / "tokenizer", 100, 2, True, words=True)
    assert read_settings(source / "tokenizer")["words"] is True and Tokenizer.load(source / "tokenizer").words
    config = load_config("zh-sentiment", [f"model.init_from={source}"])
    assert config.tokenizer.words is False
    tokenizer = run_vocabulary(config, tmp_path / "fine-tune" / "tokenizer", [], say=lambda _: None)
    assert tokenizer.words and tokenizer.vocab == Tokenizer.load(source / "tokenizer").vocab
    assert "手机" in tokenizer.vocab
    # A tokenizer.json from before word-aware vocabularies has no "words": BERT's.
    copy_vocab(str(source / "tokenizer" / "vocab.txt"), tmp_path / "old", lowercase=True)
    (tmp_path / "old" / "tokenizer.json").write_text(json.dumps({"lowercase": True, "normalization": "NFKC"}))
    assert Tokenizer.load(tmp_path / "old").words is False
