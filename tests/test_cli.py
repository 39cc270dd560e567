"""End to end through the real command line: a tiny BERT trained on real People's Daily text.

One short run (tens of steps) is shared by the tests below; each asserts one part of the
contract: the run directory, the logs, eval --json, resume, and one-line user errors.
"""

import json
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
import yaml
from cli_helpers import TINY, read_metrics, start, trainformer


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 30-step run; returns (run_dir, stdout)."""
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    result = trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=30")
    return run_dir, result.stdout


def test_run_directory_contract(run):
    run_dir, stdout = run
    for name in ("config.yaml", "manifest.json", "tokenizer/vocab.txt", "metrics.jsonl"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoints" / "checkpoint").is_file()
    assert (run_dir / "checkpoints" / "best" / "checkpoint").is_file()
    for split in ("train", "valid"):
        assert any((run_dir / "logs" / split).glob("events.out.tfevents.*")), split
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["d_model"] == 32 and config["train"]["steps"] == 30  # resolved, overrides included
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["seed"] == 42 and manifest["num_params"] > 0
    assert manifest["packages"]["tensorflow"].startswith("2.21")
    assert len(manifest["data"]["fingerprint"]) == 64 and manifest["data"]["skipped_lines"] == {}
    assert manifest["final_eval"]["step"] == 30 and manifest["devices"]
    assert f"run directory: {run_dir}" in stdout and "tensorboard --logdir" in stdout


def test_summary_and_progress_lines(run):
    _, stdout = run
    assert "parameters" in stdout and "corpus: people-daily-1998" in stdout
    progress = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert len(progress) == 6  # every 5 of 30 steps
    assert all("tok/s" in line and "ETA" in line and "lr " in line and "data-wait" in line for line in progress)
    assert "most-frequent-token baseline" in stdout


def test_loss_decreases_on_real_text(run):
    run_dir, _ = run
    train = [entry for entry in read_metrics(run_dir) if entry.get("split") == "train"]
    assert [entry["step"] for entry in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5


def test_eval_json(run):
    run_dir, _ = run
    result = json.loads(trainformer("eval", str(run_dir), "--json").stdout)
    for key in ("loss", "perplexity", "masked_accuracy", "baseline_accuracy", "step"):
        assert key in result
    assert result["step"] == 30
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # The same fixed cloze targets as the run's own final eval: identical numbers.
    assert result["loss"] == pytest.approx(manifest["final_eval"]["loss"], rel=1e-5)
    assert 0 < result["baseline_accuracy"] < 0.2


def test_second_train_resumes_from_checkpoint(run, tmp_path):
    run_dir, _ = run
    result = trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=40")
    assert "resuming from checkpoint" in result.stdout and "(step 30/40)" in result.stdout
    assert "from cache" in result.stdout  # the corpus was not tokenized again
    steps = [e["step"] for e in read_metrics(run_dir) if e.get("split") == "train"]
    assert steps[-2:] == [35, 40] and steps.count(30) == 1  # continued, not restarted
    assert json.loads((run_dir / "manifest.json").read_text())["final_eval"]["step"] == 40


def test_run_killed_mid_training_resumes_cleanly(tmp_path):
    """kill -9 right after the first checkpoint lands: the rerun must find a loadable
    checkpoint, intact run files, and finish the run."""
    run_dir = tmp_path / "run"
    args = ["train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=120"]
    process = start(*args)
    deadline = time.monotonic() + 180
    while not (run_dir / "checkpoints" / "checkpoint").exists():
        assert process.poll() is None, "training ended before its first checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()

    result = trainformer(*args)
    assert "resuming from checkpoint" in result.stdout
    assert json.loads((run_dir / "manifest.json").read_text())["final_eval"]["step"] == 120
    read_metrics(run_dir)  # every line still parses


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_save_and_exit_0(tmp_path, signum):
    run_dir = tmp_path / "run"
    process = start("train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=100000", stdout=subprocess.PIPE)
    for line in process.stdout:  # wait until training is under way
        if line.startswith("step "):
            break
    process.send_signal(signum)
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    name = signal.Signals(signum).name
    assert f"{name}: stopped at step" in stdout and "run the same command again to resume" in stdout
    step = int(stdout.split("stopped at step ")[1].split("/")[0])
    assert step >= 5 and (run_dir / "checkpoints" / f"ckpt-{step}.index").is_file()
    segment = json.loads((run_dir / "manifest.json").read_text())["segments"][-1]
    assert segment["to_step"] == step and segment["stopped_by"] == name


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=20")
    data_file = next((run_dir / "checkpoints").glob("ckpt-20.data-*"))
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])  # truncated
    result = trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=30")
    assert "checkpoints/ckpt-20 cannot be loaded" in result.stdout
    assert "resuming from checkpoint" in result.stdout and "ckpt-10 (step 10/30)" in result.stdout
    assert json.loads((run_dir / "manifest.json").read_text())["final_eval"]["step"] == 30


def test_run_whose_checkpoints_all_fail_to_load_is_not_restarted(tmp_path):
    run_dir = tmp_path / "run"
    trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=20")
    damaged = sorted((run_dir / "checkpoints").glob("ckpt-*.data-*"))
    for data_file in damaged:
        data_file.write_bytes(b"")
    result = trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", "train.steps=30", check=False)
    assert result.returncode == 2 and "none of 2 checkpoints can be loaded" in result.stderr
    assert sorted((run_dir / "checkpoints").glob("ckpt-*.data-*")) == damaged  # nothing rotated away


def test_changed_model_on_existing_run_is_refused(run):
    run_dir, _ = run
    before = (run_dir / "config.yaml").read_text()
    result = trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", "model.d_model=64", check=False)
    assert result.returncode == 2
    assert "model.d_model was 32" in result.stderr and "Traceback" not in result.stderr
    assert (run_dir / "config.yaml").read_text() == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "model.d_modle=64"], "did you mean 'model.d_model'"),
        (["--set", "model.num_heads=3"], "model.d_model: 128 is not divisible by model.num_heads (3)"),
        (["--set", "train.steps=many"], "train.steps: expected int"),
        (["no-such-config.yaml"], "no-such-config.yaml: config file not found"),
        (["--set", "data.corpus=/no/such/corpus.txt"], "/no/such/corpus.txt: no such file"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args, message, tmp_path):
    result = trainformer("train", *args, "--run-dir", str(tmp_path / "run"), check=False)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("trainformer: error:")]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_eval_of_a_missing_run_dir(tmp_path):
    result = trainformer("eval", str(tmp_path / "nothing"), check=False)
    assert result.returncode == 2 and "not a run directory" in result.stderr


def test_data_list_names_the_builtin_corpus():
    assert "people-daily-1998" in trainformer("data", "list").stdout


def test_prometheus_metrics_are_served_while_training(tmp_path):
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = start("train", "--run-dir", str(tmp_path / "run"), *TINY, "--set", "train.steps=100000",
                    "--metrics-port", str(port))
    try:
        values = {}
        for _ in range(600):  # at most ~60 s
            time.sleep(0.1)
            assert process.poll() is None, "training ended early"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                continue  # not serving yet
            values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                      if line.startswith("trainformer_") and len(line.split()) == 2}
            if values.get("trainformer_step", 0) >= 10:
                break
        assert values["trainformer_step"] >= 10
        assert 0 < values["trainformer_train_loss"] < 20 and values["trainformer_tokens_per_second"] > 0
        assert 0 <= values["trainformer_data_wait_percent"] < 100
        assert not any(name.startswith("trainformer_gpu") for name in values)  # no GPU here: no series
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert process.returncode == 0


def test_metrics_port_in_use_is_a_one_line_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = trainformer("train", "--run-dir", str(tmp_path / "run"), *TINY, "--set", "train.steps=5",
                             "--metrics-port", str(port), check=False)
    assert result.returncode == 2 and f"--metrics-port {port}: cannot serve" in result.stderr


def test_batch_larger_than_the_corpus_is_a_one_line_error(tmp_path):
    result = trainformer("train", "--run-dir", str(tmp_path / "run"), *TINY, "--set", "train.batch_size=1000000",
                         check=False)
    assert result.returncode == 2
    assert "train.batch_size: 1000000 is more than the" in result.stderr and "training windows" in result.stderr
