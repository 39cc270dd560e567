"""Exact reproducibility through the real command line.

Deterministic runs give bitwise-equal weights in two processes, with XLA compiling the whole step
(train.xla=on: the kill -9 test) or only the update (auto: the minutes budget test), and a run
killed with SIGKILL at any point, then rerun with the same command, ends with exactly the
weights, optimizer state and dropout RNG state of a run that was never interrupted, its
metrics.jsonl holding each record once. A vocabulary learnt in two processes is byte-identical:
tests/data/test_tokenizer.py.
"""

import json
import subprocess

import numpy as np
import pytest
import tensorflow as tf
import yaml
from cli_helpers import TINY_NEWS, read_metrics, start, trainformer

DETERMINISTIC = [
    *TINY_NEWS, "--set", "train.deterministic=true", "--set", "model.dropout=0.1",
    "--set", "train.accumulate=3", "--set", "train.steps=20",
]


def final_state(run_dir, checkpoint: str = "") -> dict:
    """Every saved tensor of a checkpoint (default: the latest) but the save counter."""
    folder = run_dir / "checkpoints"
    reader = tf.train.load_checkpoint(str(folder / checkpoint) if checkpoint else tf.train.latest_checkpoint(str(folder)))
    names = [n for n in reader.get_variable_to_shape_map() if not n.startswith(("save_counter", "_CHECKPOINTABLE"))]
    return {name: reader.get_tensor(name) for name in names}


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert any("dropout_seeds" in name for name in a)  # the RNG state is part of what must match
    for name, value in a.items():
        assert np.array_equal(value, b[name]), name


def test_a_minutes_budget_sets_the_steps_once_and_trains_as_those_steps_would(tmp_path, vocab_args):
    """train.minutes times the step on a throwaway copy and writes the steps that fit into
    config.yaml; the run is then bitwise the one given those steps, and the same command
    resumes it to that count, not to the recipe's train.steps."""
    # train.steps=5000: what the budget replaces (0.6 s cannot hold 5,000 steps)
    args = [*DETERMINISTIC, *vocab_args, "--set", "train.minutes=0.01", "--set", "train.steps=5000"]
    budget, pinned = tmp_path / "budget", tmp_path / "pinned"
    first = trainformer("train", "--run-dir", str(budget), *args).stdout
    steps = yaml.safe_load((budget / "config.yaml").read_text())["train"]["steps"]
    assert steps < 5000 and f"train.steps={steps:,}, in {budget / 'config.yaml'}" in first
    assert "tokenized data cached in" in first  # a new run: the probe's prepare is not a cache hit
    trainformer("train", "--run-dir", str(pinned), *DETERMINISTIC, *vocab_args, "--set", f"train.steps={steps}")
    assert_bitwise_equal(final_state(budget), final_state(pinned))
    again = trainformer("train", "--run-dir", str(budget), *args).stdout
    assert f"nothing left to train: step {steps} >= train.steps {steps}" in again


# The kill -9 chain and its reference, with the whole step compiled by XLA
KILLED = [*DETERMINISTIC, "--set", "train.xla=on"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, vocab_args):
    """Started as a user starts it (`python -m trainformer`): the chain's processes are forked
    from the tests' command server (command_server.py), and must compute it bitwise."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    trainformer("train", "--run-dir", str(run_dir), *KILLED, *vocab_args, fork=False)
    return final_state(run_dir)


def wait_for_progress_line(process, step: int) -> str:
    """Read process's stdout up to its progress line for `step`; what it read."""
    seen = []
    for line in process.stdout:  # "step  5/20  loss ..."
        seen.append(line)
        if line.startswith("step ") and line.split()[1].startswith(f"{step}/"):
            return "".join(seen)
    raise AssertionError(f"training ended before step {step}")


def kill_9(process) -> str:
    """SIGKILL process; what it printed that was not read yet."""
    process.kill()
    return process.communicate()[0]


def test_kill_9_three_times_and_rerun_matches_an_uninterrupted_run(tmp_path, vocab_args, uninterrupted):
    """One run killed with SIGKILL at three points in turn, each time started again with the same
    command: before its first checkpoint (the next start begins afresh), right after a checkpoint
    lands, and mid-step (each step runs 3 accumulated micro-batches; most of the wall time is
    inside one). Checkpoints come every 10 steps. The first checkpoint's steps are computed by a
    fresh process in each, so equal weights also show XLA's step recomputed bitwise."""
    args = ["train", "--run-dir", str(tmp_path / "run"), *KILLED, *vocab_args]
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint"

    process = start(*args, stdout=subprocess.PIPE)
    wait_for_progress_line(process, 5)
    kill_9(process)
    assert not checkpoint.exists()

    process = start(*args, stdout=subprocess.PIPE)
    while not checkpoint.exists():
        assert process.poll() is None
    assert "resuming from checkpoint" not in kill_9(process)

    process = start(*args, stdout=subprocess.PIPE)
    assert "resuming from checkpoint" in wait_for_progress_line(process, 15)
    kill_9(process)

    assert "resuming from checkpoint" in trainformer(*args).stdout
    assert_bitwise_equal(final_state(tmp_path / "run"), uninterrupted)
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["final_eval"]["step"] == 20
    logged = [(e["split"], e["step"]) for e in read_metrics(tmp_path / "run") if "split" in e]  # every line parses
    assert sorted(logged) == [("train", 5), ("train", 10), ("train", 15), ("train", 20),
                              ("valid", 15), ("valid", 20)]  # each record once
