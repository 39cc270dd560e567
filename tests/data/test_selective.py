"""Selective masking's weights: a token that tells the labels apart weighs more than one both
labels use alike, from counts of real tokens; a masked-LM run takes them from a labelled corpus."""

import numpy as np
import pytest

from trainformer.config import load_config
from trainformer.data.corpus import Corpus, load_corpus
from trainformer.data.pipeline import tokenize_documents
from trainformer.data.selective import label_token_weights
from trainformer.errors import UserError
from trainformer.run_dir import RunDir
from trainformer.tasks.mlm import MaskedLMTask
from trainformer.tokens import NUM_SPECIAL


def test_a_token_one_label_uses_weighs_more_than_one_both_use(tokenizer, corpus):
    texts = corpus.train[:400]  # real news as the shared context of both labels
    labels = [i % 2 for i in range(len(texts))]
    # label 0's texts also say 差 ("poor") thrice; both labels' texts say 的 alike
    texts = [text + ("差差差" if label == 0 else "") for text, label in zip(texts, labels)]
    stream = tokenize_documents(tokenizer, texts)
    weights = label_token_weights(stream, labels, tokenizer.vocab_size, strength=2.0)
    ids = {char: tokenizer.vocab.index(char) for char in "差的"}
    assert weights.shape == (tokenizer.vocab_size,) and weights.dtype == np.float32
    assert weights[ids["差"]] > 1 + 2.0 * 3  # ~600 times more under label 0: a spread of ~4.8, x2
    assert weights[ids["的"]] < 1.5
    assert np.all(weights[:NUM_SPECIAL] == 1.0) and np.all(weights >= 1.0)
    np.testing.assert_array_equal(label_token_weights(stream, labels, tokenizer.vocab_size, strength=0.0), 1.0)


def test_a_masked_lm_run_takes_its_weights_from_a_labelled_corpus_and_refuses_an_unlabelled_one(tmp_path, corpus):
    config = load_config(None, ["data.selective_masking=2", "data.seq_len=32", "train.batch_size=4",
                                "data.valid_fraction=0.1", "data.test_fraction=0.1"])
    task = MaskedLMTask(config)
    task.prepare(RunDir(tmp_path / "intents"), load_corpus("chatterbot-zh-intents", 0.1, 0.1), say=lambda line: None)
    assert task.token_weights.shape == (task.vocab_size,) and task.token_weights.max() > 2  # 17 labels

    news = Corpus("news", corpus.train[:300], corpus.valid[:30])
    with pytest.raises(UserError, match=r"^data\.selective_masking: weighs tokens by the labels .* news has none"):
        MaskedLMTask(config).prepare(RunDir(tmp_path / "news"), news, say=lambda line: None)
    assert not (tmp_path / "news").exists()  # refused before a vocabulary or a cache was written
