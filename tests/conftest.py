"""Shared fixtures: the real People's Daily corpus, a WordPiece vocabulary trained on it, the
in-graph tokenizer loaded from that vocabulary (~3 s), and a tiny exported intent classifier
that the export and serve tests share (~20 s). Session-scoped: built once."""

import os
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before any TensorFlow import

import pytest

# trainformer is imported inside the fixtures: under pytest-xdist this file is loaded by the
# controller too, which runs no test and would spend seconds importing TensorFlow for nothing
# (printing its start-up records, since no capture is active there).


@pytest.fixture(scope="session")
def corpus():
    from trainformer.data.corpus import load_corpus

    return load_corpus("people-daily-1998", 0.05)


@pytest.fixture(scope="session")
def vocab_dir(corpus, tmp_path_factory):
    from trainformer.data.tokenizer import train_vocab

    folder = tmp_path_factory.mktemp("vocab")
    train_vocab(corpus.train, folder, vocab_size=8000, min_frequency=2, lowercase=True)
    return folder


@pytest.fixture(scope="session")
def vocab_args(vocab_dir):
    """`trainformer train` options that use that vocabulary: a run whose test is not about the
    vocabulary skips training its own (~5 s of each such run on 2 cores)."""
    return ["--set", f"tokenizer.vocab_file={vocab_dir / 'vocab.txt'}"]


@pytest.fixture(scope="session")
def tokenizer(vocab_dir):
    from trainformer.data.tokenizer import Tokenizer

    return Tokenizer.load(vocab_dir)


class IntentExport(NamedTuple):
    """What intent_export gives, by name or as (run_dir, base, stdout, version_dir)."""

    run_dir: Path  # the run: root/run
    base: Path  # the export base (TF Serving's model base path): root/intent
    stdout: str  # what `trainformer export` printed
    version_dir: Path  # the one version in it: root/intent/20 (the checkpoint's step)


@pytest.fixture(scope="session")
def intent_export(tmp_path_factory):
    """A tiny classifier trained 20 steps on the real chatterbot intents, exported in every
    format (quantized TFLite too) by the real command into the export base "intent", where it is
    version 20 (the checkpoint's step): IntentExport(run_dir, base, stdout, version_dir)."""
    from cli_helpers import TINY, trainformer

    root = tmp_path_factory.mktemp("intent")
    # fp32: an export is float32, and the tests compare it with predict on the run itself
    trainformer("train", "zh-intent", "--run-dir", str(root / "run"), *TINY, "--set", "train.steps=20",
                "--set", "train.precision=fp32")
    result = trainformer("export", str(root / "run"), "--out", str(root / "intent"), "--quantize", "dynamic,float16")
    return IntentExport(root / "run", root / "intent", result.stdout, root / "intent" / "20")
