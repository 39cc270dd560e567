"""What the command line says, through the real command: eval's tables and progress, a reader
that stops reading, predict's warnings, what an export records about its run, and Ctrl-C
before anything was saved. Real runs on real data (tiny models), no mocks."""

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import ENV, TINY, in_process, trainformer
from safetensors.numpy import load_file, save_file

from trainformer.run.inference import untrained_head
from trainformer.run.start import interrupted_line
from trainformer.run_dir import RunDir
from trainformer.tasks.seq2seq import DecodeProgress

HF_FIXTURE = Path(__file__).parent / "fixtures" / "tiny-hf-bert"
def command(*args) -> list[str]:
    return [sys.executable, "-m", "trainformer", *args]


# --- eval ---------------------------------------------------------------------------------------

def test_plain_eval_of_a_classify_run_prints_aligned_tables(intent_export):
    run_dir = intent_export[0]
    result = json.loads(in_process("eval", str(run_dir), "--json").stdout)
    labels = list(result["per_class"])
    text = in_process("eval", str(run_dir)).stdout
    lines = text.splitlines()
    assert "{" not in text and "[[" not in text  # no Python reprs
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["label", "precision"])
    rows = lines[header + 1: header + 1 + len(labels)]
    assert [row.split()[0] for row in rows] == labels
    assert len({row.index(".") for row in rows}) == 1  # precision column aligned
    first = labels[0]
    assert rows[0].split()[1:] == [f"{result['per_class'][first][key]:.4f}" for key in ("precision", "recall", "f1")] \
        + [str(result["support"][first])]
    top = lines.index("confusion (rows: true label; columns: predicted, numbered as the rows)")
    matrix = lines[top + 2: top + 2 + len(labels)]
    assert lines[top + 1].split()[-len(labels):] == [str(i + 1) for i in range(len(labels))]
    assert [[int(cell) for cell in row.split()[-len(labels):]] for row in matrix] == result["confusion"]
    assert len({len(row) for row in matrix}) == 1  # every row as wide: the columns line up
    assert any(line.startswith("accuracy ") for line in lines)


@pytest.mark.parametrize("args", [["data", "list"], ["eval", "RUN", "--json"]], ids=["data-list", "eval-json"])
def test_a_reader_that_stops_reading_ends_the_command_quietly(intent_export, args):
    """`trainformer eval RUN --json | head -c 300`: the pipe closes before we write."""
    args = [str(intent_export[0]) if arg == "RUN" else arg for arg in args]
    process = subprocess.Popen(command(*args), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # the reader is gone
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 141, stderr  # 128 + SIGPIPE, as a shell reports it
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr


def test_seq2seq_eval_says_how_far_decoding_is_on_stderr_and_takes_decode_settings(headline_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(headline_run[0], run_dir)  # eval writes its outputs into the run
    result = in_process("eval", str(run_dir), "--split", "test", "--json", "--set", "decode.strategy=greedy",
                         "--set", "decode.max_length=12")
    scores = json.loads(result.stdout)  # stdout: the JSON alone
    assert scores["decode"] == {"strategy": "greedy", "max_length": 12}
    assert f"decoded test: {scores['num_examples']:,} sentences in " in result.stderr
    assert "decode:\n  strategy: beam" in (run_dir / "config.yaml").read_text()  # the run is left as trained


@pytest.mark.parametrize("item, message", [
    ("train.steps=5", "--set train.steps=5: eval changes only how a seq2seq run decodes"),
    ("decode.beam_size=0", "decode.beam_size: must be > 0"),
    ("decode.strategy=sample", "decode.strategy: 'sample' is not one of greedy, beam"),
])
def test_eval_refuses_any_other_setting_in_one_line(headline_run, item, message):
    result = in_process("eval", str(headline_run[0]), "--set", item, check=False)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_decode_progress_says_done_eta_and_rate_every_few_seconds():
    now = [0.0]
    said = []
    meter = DecodeProgress("test", 1736, said.append, every_s=5, clock=lambda: now[0])
    for _ in range(4):
        now[0] += 2.0
        meter.advance(32)  # 128 sentences after 8 s: one line, at 6 s (96 done)
    assert said == ["decoding test: 96/1,736 sentences, 16.0/s, ETA 1m"]
    now[0] = 100.0
    meter.advance(1608)
    meter.finish()
    assert said[-1] == "decoded test: 1,736 sentences in 1m"  # no progress line once all are done
    DecodeProgress("valid", 10).advance(10)  # without say: silent (training's evals)


# --- predict on an imported BERT ----------------------------------------------------------------

@pytest.fixture(scope="module")
def headless_import(tmp_path_factory):
    """The tiny random HF BERT without its MLM head (a BertModel checkpoint), imported."""
    root = tmp_path_factory.mktemp("headless")
    hf_dir = root / "hf"
    hf_dir.mkdir()
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(HF_FIXTURE / name, hf_dir / name)
    tensors = {k: v for k, v in load_file(str(HF_FIXTURE / "model.safetensors")).items() if not k.startswith("cls.")}
    save_file(tensors, str(hf_dir / "model.safetensors"))
    trainformer("import", "hf", str(hf_dir), "--run-dir", str(root / "run"))
    return root / "run"


def test_predict_warns_when_the_mlm_head_is_untrained_and_accepts_mask_in_any_case(headless_import):
    result = in_process("predict", str(headless_import), "the [MASK] is good", "the [mask] is good",
                         "the [Mask] is good")
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "MLM head" in warnings[0] and "random" in warnings[0]
    upper, lower, mixed = (json.loads(line) for line in result.stdout.splitlines())
    # the same answer (rows of one batch may differ in the last bits: predict computes in bf16 where that is fast)
    def tokens(answer):
        return [[candidate["token"] for candidate in mask] for mask in answer["masks"]]

    def probabilities(answer):
        return [candidate["probability"] for candidate in answer["masks"][0]]

    for answer in (lower, mixed):
        assert tokens(answer) == tokens(upper)
        assert probabilities(answer) == pytest.approx(probabilities(upper), abs=2e-3)
    assert untrained_head(RunDir(headless_import), "classify") is None  # a classifier's head is its own


# --- export -------------------------------------------------------------------------------------

def test_export_metadata_names_its_run_portably(intent_export):
    run_dir, export_dir = intent_export.run_dir, intent_export.version_dir  # conftest: root/run -> root/intent/20
    text = (export_dir / "metadata.json").read_text()
    metadata = json.loads(text)
    assert metadata["run"] == "run" and metadata["run_dir"] == "../../run"
    assert (export_dir / metadata["run_dir"]).resolve() == run_dir.resolve()
    assert metadata["checkpoint"] == f"checkpoints/ckpt-{metadata['step']}"
    assert str(run_dir.parent) not in text  # no absolute path of this machine


# --- train --------------------------------------------------------------------------------------

def test_train_help_says_it_trains_any_task():
    usage = trainformer("train", "--help").stdout
    assert "pretrain a model" not in usage
    top = trainformer("--help").stdout
    assert "train a model for its task" in " ".join(top.split())


def test_ctrl_c_before_the_first_checkpoint_says_the_run_starts_over(tmp_path):
    run_dir = tmp_path / "run"
    # A test run started in the background of a shell (`cmd &`) inherits SIGINT ignored, and
    # Python then leaves Ctrl-C ignored until the loop installs its own handler: a user's
    # terminal always delivers it, so the child gets the default disposition back.
    process = subprocess.Popen(command("train", "--run-dir", str(run_dir), *TINY), env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in process.stdout:  # the corpus is read; the vocabulary and token cache come next
        if line.startswith("corpus:"):
            break
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stdout + stderr
    assert "interrupted before the first checkpoint: nothing was saved, so rerunning the same command starts " \
           "the run over" in stderr
    assert "resume from the last checkpoint" not in stderr and "Traceback" not in stderr


def test_a_crash_in_native_code_prints_the_python_stack_it_happened_under(tmp_path):
    """What a user pastes into a bug report when TensorFlow's C++ side dies: faulthandler's
    dump, which the stderr filter (quiet.py) passes through."""
    process = subprocess.Popen(command("train", "--run-dir", str(tmp_path / "run"), *TINY), env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        if line.startswith("corpus:"):
            break
    process.send_signal(signal.SIGSEGV)  # as a segfault in a kernel would raise it
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == -signal.SIGSEGV, stdout + stderr
    assert "Fatal Python error: Segmentation fault" in stderr and "trainformer/" in stderr, stderr


def test_an_interrupt_after_a_checkpoint_says_where_to_resume(tmp_path):
    run = RunDir(tmp_path / "run")
    run.checkpoints_dir.mkdir(parents=True)
    (run.checkpoints_dir / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    line = interrupted_line(run)
    assert line.startswith("interrupted: stopped at once without saving; rerun the same command to resume")
    assert f"trainformer train --run-dir {run.root}" in line
