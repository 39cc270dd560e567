"""Multi-device training through the real command line: MirroredStrategy on two logical CPU
devices and two local MultiWorkerMirroredStrategy workers (trainformer launch) compute the
one-device update of the same global batch. The two-worker run also shows that `launch` relays
its workers without TensorFlow's logging (tests/test_quiet.py's subject; one launch saved)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from cli_helpers import CLEAN_ENV, ENV, NOISE, TINY, TINY_NEWS, read_metrics, trainformer

# fp32: strategies are compared at rtol 1e-5, and bf16 rounds differently when the batch is split.
# One eval, at the end: the tests compare training steps, and each eval costs seconds per run.
RUN = [*TINY_NEWS, "--set", "train.steps=20", "--set", "train.log_every=1", "--set", "train.accumulate=2",
       "--set", "train.precision=fp32", "--set", "train.eval_every=20"]


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


@pytest.fixture(scope="module")
def mirrored_run(tmp_path_factory, vocab_args):
    """The one_device run, on two logical CPU devices (mirrored): (run_dir, stdout)."""
    run_dir = tmp_path_factory.mktemp("mirrored") / "run"
    result = trainformer("train", "--run-dir", str(run_dir), *RUN, *vocab_args,
                         "--set", "train.strategy=mirrored", "--set", "runtime.cpu_devices=2")
    return run_dir, result.stdout


def test_mirrored_on_two_cpus_matches_one_device(mirrored_run, one_device):
    mirrored, stdout = mirrored_run
    assert "MirroredStrategy: 2 replica(s)" in stdout
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
    assert "train.batch_size: 15 examples cannot be split evenly across 2 replicas" in result.stderr


def launch(*args, env=ENV) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainformer", "launch", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def digests(output: str) -> list[str]:
    return [line.split()[-1] for line in output.splitlines() if "weights sha256" in line]


def wait_for_step(process: subprocess.Popen, step: int) -> str:
    """Read process's output up to its progress line for `step`; what it read."""
    seen = []
    for line in process.stdout:  # "step   5/20  loss ..."
        seen.append(line)
        if re.match(rf"step +{step}/", line):
            return "".join(seen)
    raise AssertionError(f"the run ended before step {step}")


def folders(path) -> list:
    return [p for p in path.iterdir() if p.is_dir()]  # (autograph also writes files there)


def test_two_workers_stopped_by_sigterm_resume_and_end_bitwise_equal_matching_one_process(
        tmp_path, one_device, vocab_args):
    """SIGTERM stops both workers at one step; rerun, they end with bitwise equal weights and the
    one-process run's losses. As a user runs it (no TF_CPP_MIN_LOG_LEVEL): the launcher and the
    workers filter TensorFlow's logging."""
    run_dir = tmp_path / "run"
    args = ["--workers", "2", "--", "train", "--run-dir", str(run_dir), *RUN, *vocab_args]
    scratch = tmp_path / "tmp"  # TMPDIR of the workers: where the non-chief writes its own files
    scratch.mkdir()
    process = launch(*args, env={**CLEAN_ENV, "TMPDIR": str(scratch)})
    output = wait_for_step(process, 2)  # steps take ~0.1 s: the stop lands well before step 20
    (folder,) = folders(scratch)  # the non-chief's scratch run directory, in use
    assert (folder / "metrics.jsonl").is_file()
    process.send_signal(signal.SIGTERM)
    output += process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    stopped_at = int(re.search(r"SIGTERM: stopped at step (\d+)/20", output).group(1))
    assert folders(scratch) == []  # deleted when the worker exited

    resumed = launch(*args, env=CLEAN_ENV)
    output += resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output
    assert not NOISE.search(output), output
    assert "2 replica(s) on 2 workers" in output
    assert "resuming from checkpoint" in output and f"(step {stopped_at}/20)" in output
    assert "[worker 1] weights sha256" in output  # the non-chief's own lines still come through
    chief, worker = digests(output)
    assert chief == worker  # the non-chief's weights, bitwise
    assert json.loads((run_dir / "manifest.json").read_text())["weights_sha256"] == chief
    assert len(train_losses(run_dir)) == 20  # one writer: every step logged once, across the stop
    np.testing.assert_allclose(train_losses(run_dir), train_losses(one_device), rtol=1e-5)


def test_a_dead_worker_stops_the_others_and_leaves_no_process(tmp_path, vocab_args):
    process = launch("--workers", "2", "--", "train", "--run-dir", str(tmp_path / "run"), *RUN, *vocab_args,
                     "--set", "train.steps=100000")
    pids = [int(pid) for pid in re.search(r"\(pids ([\d, ]+)\)", process.stdout.readline()).group(1).split(", ")]
    wait_for_step(process, 5)
    os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 128 + signal.SIGKILL, output
    assert "worker 1 was killed by SIGKILL; stopping the others" in output
    assert time.monotonic() - started < 60
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("strategy, message", [
    ("multi_worker", "train.strategy: multi_worker needs TF_CONFIG"),
    ("tpu", "train.strategy: tpu: no TPU found"),
])
def test_a_strategy_without_its_hardware_is_a_one_line_error(tmp_path, strategy, message):
    result = trainformer("train", "--run-dir", str(tmp_path / "run"), *TINY, "--set", f"train.strategy={strategy}",
                         check=False)
    assert result.returncode == 2 and message in result.stderr
    assert not (tmp_path / "run").exists()  # nothing written


def test_fp16_loss_scaling_under_mirrored(tmp_path, vocab_args, one_device):
    """Each overflow skips its step and halves the scale from 2**15 (no growth in 6 steps); the
    applied steps' gradients are unscaled: their norm is fp32's, not 2**k times it."""
    run_dir = tmp_path / "run"
    trainformer("train", "--run-dir", str(run_dir), *RUN, *vocab_args, "--set", "train.steps=6",
                "--set", "train.precision=fp16", "--set", "train.strategy=mirrored", "--set", "runtime.cpu_devices=2")
    logged = [m for m in read_metrics(run_dir) if m.get("split") == "train"]
    assert len(logged) == 6 and all(np.isfinite(m["loss"]) for m in logged)
    skipped = 0
    for entry in logged:  # log_every=1: one line per step
        skipped += not np.isfinite(entry["grad_norm"])
        assert entry["skipped_steps"] == skipped, entry
        assert entry["loss_scale"] == 2.0**15 / 2**skipped, entry
    assert skipped < 6  # some steps were applied
    fp32 = {m["step"]: m["grad_norm"] for m in read_metrics(one_device) if m.get("split") == "train"}
    for entry in logged:
        if np.isfinite(entry["grad_norm"]):
            assert 0.5 < entry["grad_norm"] / fp32[entry["step"]] < 2, (entry, fp32[entry["step"]])


@pytest.mark.parametrize("args, message", [
    (["--workers", "2"], "launch: expected the train command after '--'"),
    (["--workers", "0", "--", "train"], "launch --workers: must be >= 1, got 0"),
    (["--workers", "2", "--", "train", "--set", "train.stepz=3"], "unknown key 'train.stepz'"),
])
def test_bad_launch_is_a_one_line_error_before_any_worker_starts(args, message):
    result = trainformer("launch", *args, check=False)
    assert result.returncode == 2 and message in result.stderr and "launch: 2 workers" not in result.stdout


def test_a_mirrored_run_resumes_on_one_device(tmp_path, mirrored_run, one_device, vocab_args):
    """The two-replica run, as kill -9 would leave it right after its step-10 checkpoint (a
    copy with the later checkpoint and log lines removed), resumed on one device: it computes
    the uninterrupted one-device run's updates."""
    run_dir = tmp_path / "run"
    shutil.copytree(mirrored_run[0], run_dir)
    checkpoints = str(run_dir / "checkpoints")
    state = tf.train.get_checkpoint_state(checkpoints)
    (path, *_), (stamp, *_) = state.all_model_checkpoint_paths, state.all_model_checkpoint_timestamps
    assert path.endswith("ckpt-10") and state.model_checkpoint_path.endswith("ckpt-20")
    tf.compat.v1.train.update_checkpoint_state(checkpoints, path, [path], all_model_checkpoint_timestamps=[stamp],
                                               last_preserved_timestamp=state.last_preserved_timestamp)
    for later in (run_dir / "checkpoints").glob("ckpt-20.*"):
        later.unlink()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines if json.loads(line).get("step", 0) <= 10))

    resumed = trainformer("train", "--run-dir", str(run_dir), *RUN, *vocab_args, "--set", "train.strategy=one_device")
    assert "resuming from checkpoint" in resumed.stdout and "(step 10/20)" in resumed.stdout
    assert "OneDeviceStrategy: 1 replica(s)" in resumed.stdout
    assert [m["step"] for m in read_metrics(run_dir) if m.get("split") == "train"] == list(range(1, 21))
    np.testing.assert_allclose(train_losses(run_dir), train_losses(one_device), rtol=1e-5)
    reference = weights(one_device)
    resumed_weights = weights(run_dir)
    assert resumed_weights.keys() == reference.keys()
    for name, value in resumed_weights.items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-4, atol=1e-6, err_msg=name)
