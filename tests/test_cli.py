"""End to end through the real command line: a tiny BERT trained on real People's Daily text.

One short run (tens of steps) is shared by the tests below; each asserts one part of the
contract: the run directory, the logs, eval --json, resume, and one-line user errors. It is
trained as a user would run it (no TF_CPP_MIN_LOG_LEVEL), so it also shows that a training run
prints nothing on stderr (tests/test_quiet.py's subject, checked here to save a run). Runs
that test something other than the vocabulary use the session's (vocab_args): each would
spend ~5 s training its own.
"""

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from cli_helpers import CLEAN_ENV, ENV, NOISE, TINY, TINY_NEWS, in_process, read_metrics, start, trainformer

from trainformer.train.precision import resolve_precision


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 30-step run, its vocabulary trained too, its last 10 steps on windows of 64
    tokens (data.long_seq_len); returns (run_dir, stdout, stderr)."""
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    result = trainformer("train", "--run-dir", str(run_dir), *TINY_NEWS, "--set", "train.steps=30",
                         "--set", "data.long_seq_len=64", "--set", "data.long_fraction=0.34", env=CLEAN_ENV)
    return run_dir, result.stdout, result.stderr


def test_run_directory_contract(run):
    run_dir, stdout, _ = run
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
    _, stdout, _ = run
    assert "parameters" in stdout and "corpus: people-daily-1998" in stdout
    progress = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert len(progress) == 6  # every 5 of 30 steps
    assert all("tok/s" in line and "ETA" in line and "lr " in line and "data-wait" in line for line in progress)
    assert "most-frequent-token baseline" in stdout
    assert "  from step 20: " in stdout and " windows of 64 tokens, batch 8 (data.long_seq_len)" in stdout


def test_a_training_run_prints_nothing_on_stderr(run):
    """TensorFlow's start-up records and notices are filtered out (trainformer/quiet.py)."""
    _, stdout, stderr = run
    assert "step 30/30" in stdout and not NOISE.search(stdout)
    assert stderr == ""


def test_loss_decreases_on_real_text(run):
    run_dir, _, _ = run
    train = [entry for entry in read_metrics(run_dir) if entry.get("split") == "train"]
    assert [entry["step"] for entry in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5


def test_eval_json(run):
    run_dir, _, _ = run
    result = json.loads(in_process("eval", str(run_dir), "--json").stdout)
    for key in ("loss", "perplexity", "masked_accuracy", "baseline_accuracy", "step"):
        assert key in result
    assert result["step"] == 30
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # The same fixed cloze targets as the run's own final eval: identical numbers.
    assert result["loss"] == pytest.approx(manifest["final_eval"]["loss"], rel=1e-5)
    final_valid = [e for e in read_metrics(run_dir) if e.get("split") == "valid" and e["step"] == 30][-1]
    assert result["baseline_accuracy"] == final_valid["baseline_accuracy"]  # the same targets, counted again


def test_second_train_resumes_from_checkpoint(run, tmp_path):
    """`train --run-dir R` alone resumes R with its own config (the run's --set overrides included)."""
    run_dir, _, _ = run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "precision": "fp16"}))  # as if trained elsewhere
    result = trainformer("train", "--run-dir", str(run_dir), "--set", "train.steps=40")
    assert "resuming from checkpoint" in result.stdout and "(step 30/40)" in result.stdout
    assert "precision: this run trained in fp16 until step 30 and goes on in fp32 here" in result.stdout  # TINY's
    assert "from cache" in result.stdout  # the corpus was not tokenized again
    steps = [e["step"] for e in read_metrics(run_dir) if e.get("split") == "train"]
    assert steps[-2:] == [35, 40] and steps.count(30) == 1  # continued, not restarted
    assert json.loads((run_dir / "manifest.json").read_text())["final_eval"]["step"] == 40

    event_files = sorted((run_dir / "logs").rglob("events.out.tfevents.*"))
    again = trainformer("train", "--run-dir", str(run_dir))
    assert f"to train longer: trainformer train --run-dir {run_dir} --set train.steps=N" in again.stdout
    assert sorted((run_dir / "logs").rglob("events.out.tfevents.*")) == event_files  # no empty pair added


def assert_stopped_and_saved(process, stdout: str, run_dir, name: str) -> None:
    """A run stopped by the signal `name` once under way: it exits 0, says how to resume, and
    saved a checkpoint at the step it stopped, which the manifest's last segment records."""
    assert process.returncode == 0
    assert f"{name}: stopped at step" in stdout and f"to resume: trainformer train --run-dir {run_dir}" in stdout
    step = int(stdout.split("stopped at step ")[1].split("/")[0])
    assert step >= 5 and (run_dir / "checkpoints" / f"ckpt-{step}.index").is_file()
    segment = json.loads((run_dir / "manifest.json").read_text())["segments"][-1]
    assert segment["to_step"] == step and segment["stopped_by"] == name


@pytest.fixture(scope="module")
def twenty_steps(tmp_path_factory, vocab_args):
    """A finished 20-step run (checkpoints at 10 and 20), to copy: each test damages its own copy."""
    run_dir = tmp_path_factory.mktemp("twenty") / "run"
    trainformer("train", "--run-dir", str(run_dir), *TINY_NEWS, *vocab_args, "--set", "train.steps=20")
    return run_dir


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, twenty_steps, vocab_args):
    run_dir = tmp_path / "run"
    shutil.copytree(twenty_steps, run_dir)
    data_file = next((run_dir / "checkpoints").glob("ckpt-20.data-*"))
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])  # truncated
    result = trainformer("train", "--run-dir", str(run_dir), *TINY_NEWS, *vocab_args, "--set", "train.steps=30")
    assert "checkpoints/ckpt-20 cannot be loaded" in result.stdout
    assert "resuming from checkpoint" in result.stdout and "ckpt-10 (step 10/30)" in result.stdout
    assert json.loads((run_dir / "manifest.json").read_text())["final_eval"]["step"] == 30


def test_run_whose_checkpoints_all_fail_to_load_is_not_restarted(tmp_path, twenty_steps, vocab_args):
    run_dir = tmp_path / "run"
    shutil.copytree(twenty_steps, run_dir)
    damaged = sorted((run_dir / "checkpoints").glob("ckpt-*.data-*"))
    for data_file in damaged:
        data_file.write_bytes(b"")
    result = trainformer("train", "--run-dir", str(run_dir), *TINY_NEWS, *vocab_args, "--set", "train.steps=30",
                         check=False)
    assert result.returncode == 2 and "none of 2 checkpoints can be loaded" in result.stderr
    assert sorted((run_dir / "checkpoints").glob("ckpt-*.data-*")) == damaged  # nothing rotated away


def test_changed_model_on_existing_run_is_refused(run):
    run_dir, _, _ = run
    before = (run_dir / "config.yaml").read_text()
    result = trainformer("train", "--run-dir", str(run_dir), *TINY_NEWS, "--set", "model.d_model=64", check=False)
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
        (["--set", "train.steps", "50"], "--set train.steps: expected key=value with '='"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args, message, tmp_path):
    result = trainformer("train", *args, "--run-dir", str(tmp_path / "run"), check=False)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("trainformer: error:")]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # found before anything was written


def test_debug_after_the_verb_shows_the_traceback(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    quiet = trainformer("train", "--run-dir", str(tmp_path / "file"), check=False)
    loud = trainformer("train", "--run-dir", str(tmp_path / "file"), "--debug", check=False)
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr
    assert "Traceback" in loud.stderr and "UserError: --run-dir" in loud.stderr
    assert (tmp_path / "file").read_text() == "not a folder"


def test_version_names_the_stack():
    assert trainformer("--version").stdout.startswith("trainformer 0.1.0 (tensorflow 2.21")


def test_failed_first_attempts_leave_nothing_and_block_nothing(tmp_path, vocab_args):
    """A corrected command must work after a failed one (a config that never trained is not a run)."""
    run_dir = tmp_path / "run"
    (tmp_path / "empty.txt").write_text("\n \n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for bad in (["--set", "data.corpus=missing.txt"], ["--set", f"data.corpus={tmp_path / 'empty.txt'}"],
                    ["--metrics-port", port]):
            result = trainformer("train", "--run-dir", str(run_dir), *TINY, *vocab_args, *bad, check=False)
            assert result.returncode == 2 and not run_dir.exists(), result.stderr
    # Too large a batch is found only once the corpus is tokenized: config.yaml is written by then.
    result = trainformer("train", "--run-dir", str(run_dir), *TINY, *vocab_args, "--set", "train.batch_size=1000000",
                         check=False)
    assert result.returncode == 2 and "train.batch_size: 1000000 is more than the" in result.stderr
    assert "training windows" in result.stderr
    result = in_process("eval", str(run_dir), check=False)
    assert result.returncode == 2 and "no checkpoint yet" in result.stderr
    result = trainformer("train", "--run-dir", str(run_dir), *TINY_NEWS, *vocab_args, "--set", "train.steps=10")
    assert "done in" in result.stdout


def test_a_run_is_trained_by_one_process_at_a_time(tmp_path, vocab_args):
    """A second train on a running run is refused (naming the holder); eval is allowed. Then
    Ctrl-C (SIGINT): the run saves and exits 0. SIGTERM's stop is every stop_after_line's."""
    run_dir = tmp_path / "run"
    process = start("train", "--run-dir", str(run_dir), *TINY_NEWS, *vocab_args, "--set", "train.steps=100000",
                    stdout=subprocess.PIPE)
    try:
        for line in process.stdout:  # checkpoints come every 10 steps
            if line.startswith("step ") and line.split()[1].startswith("10/"):
                break
        second = trainformer("train", "--run-dir", str(run_dir), check=False)
        assert second.returncode == 2
        assert f"another trainformer train is running on this run directory (pid {process.pid})" in second.stderr
        assert json.loads(in_process("eval", str(run_dir), "--json").stdout)["step"] >= 10
    finally:
        process.send_signal(signal.SIGINT)
        stdout, _ = process.communicate(timeout=60)
    assert_stopped_and_saved(process, stdout, run_dir, "SIGINT")
    steps = [e["step"] for e in read_metrics(run_dir) if e.get("split") == "train"]
    assert steps == sorted(set(steps))  # one run's records only


def test_own_corpus_run_eval_without_the_corpus_and_a_changed_corpus_refused(tmp_path, corpus):
    news = tmp_path / "news.txt"
    news.write_text("\n".join(corpus.train[:380] + corpus.valid[:20]) + "\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    args = ["train", "--run-dir", str(run_dir), *TINY, "--set", f"data.corpus={news}", "--set", "train.steps=10",
            "--set", "train.warmup_steps=200", "--set", "train.precision=auto"]
    result = trainformer(*args)
    assert "warmup: train.warmup_steps=200 is longer than the run: capped at train.steps=10" in result.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    final = manifest["final_eval"]
    # precision auto: the start summary and the manifest say what it chose here and why
    precision, why = resolve_precision("auto")
    why = why.split(" ran bf16 matmuls at")[0]  # a CPU with bf16 instructions quotes the ratio it measured then
    assert f"parameters, {precision}\n" in result.stdout and f"precision: {precision} ({why}" in result.stdout
    assert manifest["precision"] == precision and manifest["precision_reason"].startswith(why)

    news.rename(tmp_path / "moved.txt")  # eval reads the run's token cache, not the corpus
    assert json.loads(in_process("eval", str(run_dir), "--json").stdout)["loss"] == pytest.approx(final["loss"])

    (tmp_path / "moved.txt").rename(news)
    with news.open("a", encoding="utf-8") as handle:
        handle.write("一个新的段落。\n")
    before = (run_dir / "metrics.jsonl").read_text()
    result = trainformer(*args, "--set", "train.steps=20", check=False)
    assert result.returncode == 2 and "has changed since this run trained on it (400 -> 401 documents" in result.stderr
    assert (run_dir / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("verb", ["eval", "predict", "export"])
def test_a_path_without_a_run_or_a_checkpoint_is_refused_before_tensorflow_loads(run, tmp_path, verb):
    fresh = tmp_path / "fresh"  # a run's config and no checkpoint yet, as in its first steps
    fresh.mkdir()
    shutil.copy(run[0] / "config.yaml", fresh)
    for path, message in ((tmp_path / "nothing", "not a run directory"), (fresh, "no checkpoint yet")):
        check = (f"import sys; from trainformer.cli import main; code = main([{verb!r}, {str(path)!r}]); "
                 "print(code, 'tensorflow' in sys.modules)")
        result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=ENV, check=True)
        assert result.stdout == "2 False\n" and message in result.stderr


def test_data_list_names_the_builtin_corpus():
    assert "people-daily-1998" in trainformer("data", "list").stdout


def scrape(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None  # not serving yet
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("trainformer_") and len(line.split()) == 2}


TRAIN_GAUGE_KEYS = {"trainformer_train_loss": "loss", "trainformer_tokens_per_second": "tokens_per_s",
                    "trainformer_data_wait_percent": "data_wait_pct", "trainformer_learning_rate": "learning_rate",
                    "trainformer_grad_norm": "grad_norm", "trainformer_train_masked_accuracy": "masked_accuracy"}


def logged_record(run_dir, split: str, step) -> dict:
    return next(e for e in read_metrics(run_dir) if e.get("split") == split and e["step"] == int(step))


def test_prometheus_metrics_are_served_while_training(tmp_path, vocab_args):
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The first eval at step 100: far enough past step 10 that the 0.1 s polls below see no valid series yet
    process = start("train", "--run-dir", str(tmp_path / "run"), *TINY_NEWS, *vocab_args,
                    "--set", "train.steps=100000", "--set", "train.eval_every=100", "--metrics-port", str(port))

    def scrape_until(ready) -> dict:
        for _ in range(1200):  # at most ~2 min
            time.sleep(0.1)
            assert process.poll() is None, "training ended early"
            values = scrape(port)
            if values and ready(values):
                return values
        raise AssertionError("the metrics never got there")

    try:
        values = scrape_until(lambda v: v.get("trainformer_step", 0) >= 10)
        assert values["trainformer_step"] < 100
        # The gauges are the logged record of that step (metrics.jsonl is written first).
        logged = logged_record(tmp_path / "run", "train", values["trainformer_step"])
        for gauge, key in TRAIN_GAUGE_KEYS.items():
            assert values[gauge] == pytest.approx(logged[key], rel=1e-12), gauge
        # No eval yet and no fp16: a 0 here would read as a perfect model or a collapsed scale.
        assert not any(name.startswith(("trainformer_valid", "trainformer_loss_scale")) for name in values)
        assert not any(name.startswith("trainformer_gpu") for name in values)  # no GPU here: no series
        values = scrape_until(lambda v: "trainformer_valid_loss" in v)
        logged = logged_record(tmp_path / "run", "valid", 100)  # the first eval
        assert values["trainformer_valid_loss"] == pytest.approx(logged["loss"], rel=1e-12)
        assert values["trainformer_valid_masked_accuracy"] == pytest.approx(logged["masked_accuracy"], rel=1e-12)
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


# A verb that imports Keras as train does, reporting what Python's cycle collector is doing.
COLLECTOR_PROBE = """
import gc, sys
from trainformer import cli

def verb(args):
    print(gc.get_freeze_count(), "keras" in sys.modules)
    import keras  # noqa: F401
    print(gc.isenabled(), gc.get_freeze_count())
    return 3

cli.VERBS["diff"] = verb
sys.argv = ["trainformer", "diff", "a", "b"]
cli.command()
"""


def test_the_command_imports_keras_with_the_collector_off_and_runs_the_verb_with_it_on():
    """framework_import.py: Keras and TensorFlow's objects frozen out of the collector's passes,
    the collector back on for the verb, its exit status passed on."""
    result = subprocess.run([sys.executable, "-c", COLLECTOR_PROBE], capture_output=True, text=True, env=ENV)
    before, after = result.stdout.splitlines()
    assert result.returncode == 3 and before == "0 False"
    enabled, frozen = after.split()
    assert enabled == "True" and int(frozen) > 100_000, after
