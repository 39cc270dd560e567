"""Shared fixtures: the real People's Daily corpus, a WordPiece vocabulary trained on it, and
the in-graph tokenizer loaded from that vocabulary. Session-scoped: built once (~3 s)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before any TensorFlow import

import pytest

from trainformer.data.corpus import load_corpus
from trainformer.data.tokenizer import Tokenizer, train_vocab


@pytest.fixture(scope="session")
def corpus():
    return load_corpus("people-daily-1998", 0.05)


@pytest.fixture(scope="session")
def vocab_dir(corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocab")
    train_vocab(corpus.train, folder, vocab_size=8000, min_frequency=2, lowercase=True)
    return folder


@pytest.fixture(scope="session")
def tokenizer(vocab_dir):
    return Tokenizer.load(vocab_dir)
