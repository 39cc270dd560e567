"""ELECTRA end to end through the real command line: a tiny run on People's Daily and a
classifier fine-tuned from its discriminator. (A resume is the engine's, the same for every
task: tests/train/test_resume.py; the generator's sampling uniforms are part of the batch, a
pure function of the batch number: tests/data/test_pipeline.py.)"""

import json

import pytest
from cli_helpers import TINY_NEWS, in_process, trainformer

ELECTRA = [*TINY_NEWS, "--set", "task.type=electra", "--set", "train.steps=10", "--set", "train.eval_every=10"]


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory, vocab_args):
    run_dir = tmp_path_factory.mktemp("electra") / "run"
    result = trainformer("train", "--run-dir", str(run_dir), *ELECTRA, *vocab_args)
    return run_dir, result.stdout


def test_an_electra_run_reports_detection(electra_run):
    run_dir, stdout = electra_run
    assert "model: electra, 1 layers" in stdout
    assert "replaced-token detection acc" in stdout and "replaced-token detection accuracy" in stdout
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = [m for m in metrics if m.get("split") == "valid"][-1]
    assert 0 < final["detection_baseline"] < 1 and 0 <= final["detection_accuracy"] <= 1
    assert "warning: the discriminator" in stdout  # 10 steps teach it nothing, and the run says so


def test_a_classifier_fine_tunes_from_the_discriminator_and_predict_refuses_the_pretraining_run(electra_run, tmp_path):
    run_dir, _ = electra_run
    refused = in_process("predict", str(run_dir), "你好", check=False)
    assert refused.returncode == 2 and "fine-tune from it" in refused.stderr
    finetuned = trainformer("train", "--run-dir", str(tmp_path / "intent"), "--set", "task.type=classify",
                            "--set", "data.corpus=chatterbot-zh-intents", "--set", "data.seq_len=32",
                            "--set", "train.steps=4", "--set", f"model.init_from={run_dir}")
    assert f"encoder: from {run_dir}/checkpoints/ckpt-10" in finetuned.stdout
