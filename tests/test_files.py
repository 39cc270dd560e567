"""Atomic writes (files.py): a reader, or a run restarted after a crash, finds the old file or
the new one, never part of one; and the run directory's small files and the token cache are
all written that way."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import yaml

from trainformer.config import load_config
from trainformer.data.pipeline import cached_token_stream, tokenize_documents
from trainformer.files import write_atomic
from trainformer.train.checkpoint import Checkpoints
from trainformer.run_dir import RunDir

OLD = "old and complete\n" * 1000
NEW = "new\n" * 5000


def crash(*args, **kwargs):
    """os.replace, failing: a crash between writing the temporary file and renaming it over
    the real one (Path.replace calls os.replace too)."""
    raise OSError("simulated crash before the rename")


def test_write_atomic_writes_the_new_content(tmp_path):
    path = tmp_path / "file.txt"
    write_atomic(path, OLD)
    write_atomic(path, NEW)
    assert path.read_text() == NEW


def test_write_interrupted_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "file.txt"
    path.write_text(OLD)
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_atomic(path, NEW)
    assert path.read_text() == OLD


def test_process_killed_before_the_rename_leaves_the_old_file(tmp_path):
    """kill -9 just before the rename: nothing in the process can clean up after itself."""
    path = tmp_path / "file.txt"
    path.write_text(OLD)
    code = ("import os, signal, sys; from pathlib import Path; from trainformer.files import write_atomic; "
            "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL); "
            "write_atomic(Path(sys.argv[1]), 'new' * 100000)")
    result = subprocess.run([sys.executable, "-c", code, str(path)])
    assert result.returncode == -signal.SIGKILL
    assert path.read_text() == OLD


WRITER = """
import sys, time
from pathlib import Path
from trainformer.files import write_atomic
path, contents = Path(sys.argv[1]), [sys.argv[2] * 200_000, sys.argv[3] * 200_000]
deadline = time.monotonic() + float(sys.argv[4])
count = 0
while time.monotonic() < deadline:
    write_atomic(path, contents[count % 2])
    count += 1
print(count)
"""


def test_concurrent_reader_never_sees_a_partial_file(tmp_path):
    """One process rewrites a 1.2 MB file over and over; every read here gets one whole version."""
    path = tmp_path / "file.txt"
    versions = {"abcdef" * 200_000, "ghijkl" * 200_000}
    write_atomic(path, "abcdef" * 200_000)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "abcdef", "ghijkl", "1.5"],
                              stdout=subprocess.PIPE, text=True)
    reads, seen = 0, set()
    while writer.poll() is None:
        text = path.read_text()
        assert text in versions, f"read {len(text)} characters: a partial file"
        seen.add(text[:6])
        reads += 1
    writes = int(writer.communicate()[0])
    assert writer.returncode == 0 and writes >= 10 and reads >= 10, (writes, reads)
    assert seen == {"abcdef", "ghijkl"}  # the reads really overlapped the rewrites


# --- what goes through it ---------------------------------------------------------------------

def test_config_yaml_survives_a_crash_while_it_is_rewritten(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "run")
    config = load_config(None, ["train.steps=10"])
    run.prepare(config)
    before = run.config_file.read_text()
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        run.prepare(load_config(None, ["train.steps=20"]))
    assert run.config_file.read_text() == before
    assert yaml.safe_load(before)["train"]["steps"] == 10


def test_manifest_survives_a_crash_while_it_is_rewritten(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    manifest_v1 = {"segments": [{"from_step": 0}], "note": "x" * 10_000}
    run.write_manifest(manifest_v1)
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        run.write_manifest({"segments": [{"from_step": 0}, {"from_step": 10}]})
    assert json.loads(run.manifest_file.read_text()) == manifest_v1


def test_best_json_survives_a_crash_while_it_is_rewritten(tmp_path, monkeypatch):
    checkpoints = Checkpoints(tmp_path / "checkpoints", 1, step=tf.Variable(0, dtype=tf.int64))
    assert checkpoints.save_if_best(10, {"loss": 2.0})
    before = json.loads(checkpoints.best_file.read_text())
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        checkpoints.save_if_best(20, {"loss": 1.0})
    assert json.loads(checkpoints.best_file.read_text()) == before
    assert before["step"] == 10 and before["valid_loss"] == 2.0


def test_token_cache_is_never_left_half_written(tmp_path, tokenizer, corpus, monkeypatch):
    """A crash while caching leaves no cache file, so the next run tokenizes again instead of
    loading a truncated stream."""
    documents = corpus.train[:200]
    cache = tmp_path / "cache"
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", crash)
        with pytest.raises(OSError, match="simulated crash"):
            cached_token_stream(cache, tokenizer, documents, "fingerprint", "train")
    assert [p for p in cache.glob("*.npy") if ".partial" not in p.name] == []
    stream, was_cached = cached_token_stream(cache, tokenizer, documents, "fingerprint", "train")
    assert not was_cached
    np.testing.assert_array_equal(stream, tokenize_documents(tokenizer, documents))
