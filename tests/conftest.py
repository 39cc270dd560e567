"""Shared fixtures: the real People's Daily corpus, a WordPiece vocabulary trained on it, the
in-graph tokenizer loaded from that vocabulary (~3 s), and the tiny runs several test files read:
a masked LM on the intent set's texts that keeps two checkpoints (fine-tunes, averaging; ~10 s),
an exported intent classifier (export, serve, eval output; ~20 s), an exported translation run
(export, serve; ~40 s) and a headline run (seq2seq, eval output; ~35 s). Session-scoped; the
runs are built once per session even under pytest-xdist (built_once), and are read-only: a test
that writes into one (eval's outputs, another export version) copies it first."""

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable, NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before any TensorFlow import

import pytest

from trainformer import framework_import

# The rest of trainformer is imported inside the fixtures: under pytest-xdist this file is loaded
# by the controller too, which runs no test and would spend seconds importing TensorFlow for
# nothing (printing its start-up records, since no capture is active there). framework_import
# imports nothing heavy: each worker imports TensorFlow and Keras as the command does, with the
# cycle collector off, and keeps them out of its later passes (the tests' garbage is still collected).
framework_import.install()
if os.environ.get("PYTEST_XDIST_WORKER"):
    from cli_helpers import COMMANDS

    COMMANDS.start()  # the command server's imports (5-9 s) overlap the worker's first tests


# The files that take longest (a full run's --durations on 2 cores, most first), dealt to the
# pytest-xdist workers first: dealt last, one leaves the other worker idle at the end. xdist's own
# order (--no-loadscope-reorder in pyproject.toml turns it off) deals files with more tests first,
# which put test_resume.py's three long tests last.
SLOWEST_FILES = (
    "test_cli.py", "train/test_distributed.py", "train/test_resume.py", "test_seq2seq.py", "test_classify.py",
    "train/test_loop.py", "test_cli_output.py", "export/test_export.py", "export/test_export_seq2seq.py",
    "test_bench.py", "serve/test_serve_http.py", "test_eval_cli.py", "test_electra_cli.py",
    "interop/test_hf_export.py", "interop/test_hf_import.py",
)


def pytest_collection_modifyitems(items):
    rank = {f"tests/{name}": place for place, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, made by build(folder) once per test session: under pytest-xdist the
    first worker to ask builds it while the others wait on a file lock, then all read it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-N/, shared by the workers' popen-gwK/ folders
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


def env_with_autograph_probe(root: Path) -> dict:
    """cli_helpers.ENV for a process that lists, in root/autograph.txt, the functions AutoGraph
    converted in it (tests/autograph_probe; test_autograph.py reads the lists)."""
    from cli_helpers import ENV

    probe = Path(__file__).parent / "autograph_probe"
    path = os.pathsep.join(filter(None, [str(probe), ENV.get("PYTHONPATH")]))
    return {**ENV, "PYTHONPATH": path, "AUTOGRAPH_PROBE": str(root / "autograph.txt")}


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
    version 20 (the checkpoint's step): IntentExport(run_dir, base, stdout, version_dir). Its
    encoder adds character n-grams (model.ngram_buckets), so every format's parity covers their
    hashing too, and its vocabulary is word-aware (tokenizer.words), so every format reads the
    words the exported tokenizer.py splits; the masked LM and translation exports have neither."""
    from cli_helpers import TINY, trainformer

    def build(root):
        # fp32: an export is float32, and the tests compare it with predict on the run itself
        env = env_with_autograph_probe(root)
        trainformer("train", "zh-intent", "--run-dir", str(root / "run"), *TINY, "--set", "train.steps=20",
                    "--set", "train.precision=fp32", "--set", "model.ngram_buckets=64", "--set", "tokenizer.words=true",
                    env=env)
        result = trainformer("export", str(root / "run"), "--out", str(root / "intent"), "--quantize", "dynamic,float16",
                             env=env)
        (root / "export.out").write_text(result.stdout)

    root = built_once(tmp_path_factory, "intent", build)
    return IntentExport(root / "run", root / "intent", (root / "export.out").read_text(), root / "intent" / "20")


@pytest.fixture(scope="session")
def translation_export(tmp_path_factory):
    """cli_helpers.TRANSLATION trained and exported: (run_dir, export base, export's stdout);
    its one version is 20."""
    from cli_helpers import TRANSLATION, trainformer

    def build(root):
        trainformer("train", "--run-dir", str(root / "run"), *TRANSLATION)
        (root / "export.out").write_text(trainformer("export", str(root / "run"), "--out", str(root / "export")).stdout)

    root = built_once(tmp_path_factory, "translation", build)
    return root / "run", root / "export", (root / "export.out").read_text()


@pytest.fixture(scope="session")
def intent_pretraining(tmp_path_factory):
    """A tiny masked LM trained 20 steps on the texts of the real chatterbot intents' train
    split, keeping ckpt-10 and ckpt-20: test_classify's fine-tunes start from it,
    test_average averages it, test_export exports it."""
    from cli_helpers import INTENT_SPLIT, TINY, trainformer

    def build(root):
        stdout = trainformer("train", "--run-dir", str(root / "run"), *TINY, *INTENT_SPLIT,
                             "--set", "train.steps=20", env=env_with_autograph_probe(root)).stdout
        assert "chatterbot-zh-intents (" in stdout and "the texts of its train split: 695 train + 90 valid" in stdout

    return built_once(tmp_path_factory, "intent-pretraining", build) / "run"


@pytest.fixture(scope="session")
def headline_run(tmp_path_factory):
    """cli_helpers.HEADLINES trained: (run_dir, train's stdout)."""
    from cli_helpers import HEADLINES, trainformer

    def build(root):
        train = trainformer("train", "--run-dir", str(root / "run"), *HEADLINES, env=env_with_autograph_probe(root))
        (root / "train.out").write_text(train.stdout)

    root = built_once(tmp_path_factory, "headlines", build)
    return root / "run", (root / "train.out").read_text()
