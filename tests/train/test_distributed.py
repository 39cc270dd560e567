"""Multi-device training through the real command line: MirroredStrategy on two logical CPU
devices computes the one-device update of the same global batch."""

import json

import numpy as np
import pytest
import tensorflow as tf
from cli_helpers import TINY, read_metrics, trainformer

RUN = [*TINY, "--set", "train.steps=20", "--set", "train.log_every=1", "--set", "train.accumulate=2"]


@pytest.fixture(scope="module")
def vocab_args(vocab_dir):
    return ["--set", f"tokenizer.vocab_file={vocab_dir / 'vocab.txt'}"]


def train_losses(run_dir) -> np.ndarray:
    return np.array([m["loss"] for m in read_metrics(run_dir) if m.get("split") == "train"])


def weights(run_dir) -> dict:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run_dir / "checkpoints")))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if n.startswith("model/")}


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, vocab_args):
    run_dir = tmp_path_factory.mktemp("one_device") / "run"
    trainformer("train", "--run-dir", str(run_dir), *RUN, *vocab_args, "--set", "train.strategy=one_device")
    return run_dir


def test_mirrored_on_two_cpus_matches_one_device(tmp_path, one_device, vocab_args):
    mirrored = tmp_path / "mirrored"
    result = trainformer("train", "--run-dir", str(mirrored), *RUN, *vocab_args,
                         "--set", "train.strategy=mirrored", "--set", "runtime.cpu_devices=2")
    assert "MirroredStrategy: 2 replica(s)" in result.stdout
    assert json.loads((mirrored / "manifest.json").read_text())["replicas"] == 2
    expected = train_losses(one_device)
    assert len(expected) == 20 and expected[-1] < expected[0]
    np.testing.assert_allclose(train_losses(mirrored), expected, rtol=1e-5)
    reference = weights(one_device)
    for name, value in weights(mirrored).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_batch_that_does_not_split_across_replicas_is_an_error(tmp_path, vocab_args):
    result = trainformer("train", "--run-dir", str(tmp_path / "run"), *RUN, *vocab_args, "--set", "train.batch_size=15",
                         "--set", "train.strategy=mirrored", "--set", "runtime.cpu_devices=2", check=False)
    assert result.returncode == 2
    assert "train.batch_size: 15 windows cannot be split evenly across 2 replicas" in result.stderr
