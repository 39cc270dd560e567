"""Shared fixtures: the real People's Daily corpus, a WordPiece vocabulary trained on it, the
in-graph tokenizer loaded from that vocabulary (~3 s), and a tiny exported intent classifier
that the export and serve tests share (~20 s). Session-scoped: built once."""

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


@pytest.fixture(scope="session")
def intent_export(tmp_path_factory):
    """A tiny classifier trained 20 steps on the real chatterbot intents, exported in every
    format (quantized TFLite too) by the real command: (run dir, export dir "intent", stdout)."""
    from cli_helpers import TINY, trainformer

    root = tmp_path_factory.mktemp("intent")
    # fp32: an export is float32, and the tests compare it with predict on the run itself
    trainformer("train", "zh-intent", "--run-dir", str(root / "run"), *TINY, "--set", "train.steps=20",
                "--set", "train.precision=fp32")
    result = trainformer("export", str(root / "run"), "--out", str(root / "intent"), "--quantize", "dynamic,float16")
    return root / "run", root / "intent", result.stdout
