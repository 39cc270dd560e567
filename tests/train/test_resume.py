"""Exact reproducibility through the real command line.

Deterministic runs give bitwise-equal weights (XLA on and off), also when each trains its own
vocabulary, and a run killed with SIGKILL at any point, then rerun with the same command, ends
with exactly the weights, optimizer state and dropout RNG state of a run that was never
interrupted.
"""

import subprocess

import numpy as np
import pytest
import tensorflow as tf
from cli_helpers import TINY, start, trainformer

DETERMINISTIC = [
    *TINY, "--set", "train.deterministic=true", "--set", "model.dropout=0.1",
    "--set", "train.accumulate=3", "--set", "train.steps=40",
]


@pytest.fixture(scope="module")
def vocab_args(vocab_dir):
    return ["--set", f"tokenizer.vocab_file={vocab_dir / 'vocab.txt'}"]


def final_state(run_dir) -> dict:
    """Every saved tensor of the latest checkpoint but the save counter."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    names = [n for n in reader.get_variable_to_shape_map() if not n.startswith(("save_counter", "_CHECKPOINTABLE"))]
    return {name: reader.get_tensor(name) for name in names}


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert any("dropout_seeds" in name for name in a)  # the RNG state is part of what must match
    for name in a:
        assert np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize("xla", ["off", "on"])
def test_two_deterministic_runs_are_bitwise_equal(tmp_path, xla):
    """No tokenizer.vocab_file: each run learns its own vocabulary from the corpus (HF's WordPiece
    trainer made those differ from process to process, huggingface/tokenizers#1794)."""
    args = [*DETERMINISTIC, "--set", f"train.xla={xla}", "--set", "train.steps=20"]  # 20 steps show it
    for name in ("a", "b"):
        trainformer("train", "--run-dir", str(tmp_path / name), *args)
    vocab_a, vocab_b = ((tmp_path / name / "tokenizer" / "vocab.txt").read_bytes() for name in ("a", "b"))
    assert vocab_a == vocab_b
    assert_bitwise_equal(final_state(tmp_path / "a"), final_state(tmp_path / "b"))
    if xla == "off":  # the comparison can fail (once is enough: a third run costs ~17 s)
        trainformer("train", "--run-dir", str(tmp_path / "c"), *args, "--set", "train.seed=1")
        a, c = final_state(tmp_path / "a"), final_state(tmp_path / "c")
        assert not all(np.array_equal(a[name], c[name]) for name in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, vocab_args):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    trainformer("train", "--run-dir", str(run_dir), *DETERMINISTIC, *vocab_args)
    return final_state(run_dir)


def wait_for_progress_line(process, step: int) -> None:
    for line in process.stdout:  # "step  5/40  loss ..."
        if line.startswith("step ") and line.split()[1].startswith(f"{step}/"):
            return
    raise AssertionError(f"training ended before step {step}")


@pytest.mark.parametrize("kill_point", ["before the first checkpoint", "right after a checkpoint", "mid-step"])
def test_kill_9_and_rerun_matches_an_uninterrupted_run(tmp_path, vocab_args, uninterrupted, kill_point):
    args = ["train", "--run-dir", str(tmp_path / "run"), *DETERMINISTIC, *vocab_args]
    process = start(*args, stdout=subprocess.PIPE)
    if kill_point == "before the first checkpoint":  # checkpoints come every 10 steps
        wait_for_progress_line(process, 5)
    elif kill_point == "right after a checkpoint":
        while not (tmp_path / "run" / "checkpoints" / "checkpoint").exists():
            assert process.poll() is None
    else:  # each step runs 3 accumulated micro-batches; most of the wall time is inside one
        wait_for_progress_line(process, 15)
    process.kill()
    process.communicate()
    rerun = trainformer(*args)
    assert ("resuming from checkpoint" in rerun.stdout) == (kill_point != "before the first checkpoint")
    assert_bitwise_equal(final_state(tmp_path / "run"), uninterrupted)
