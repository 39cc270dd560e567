"""`trainformer eval` through the real command line, on one tiny run over 2,000 real People's
Daily paragraphs: the eight --json keys, --split train, --checkpoint best, and that the best
checkpoint is the eval with the lowest valid loss."""

import json
import math

import numpy as np
import pytest
from cli_helpers import TINY, in_process, read_metrics, trainformer

from trainformer.data.corpus import load_corpus
from trainformer.data.pipeline import NUM_SPECIAL, pack, tokenize_documents
from trainformer.run.inference import record_score
from trainformer.run_dir import RunDir

KEYS = {"loss", "perplexity", "masked_accuracy", "baseline_accuracy", "num_targets", "step", "split", "checkpoint"}
STEPS, SEQ_LEN, MASK_RATE = 30, 32, 0.15


@pytest.fixture(scope="module")
def corpus_file(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "people-daily-2000.txt"
    path.write_text("\n".join(corpus.train[:1900] + corpus.valid[:100]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus_file, vocab_dir):
    """A 30-step run evaluated every 5 steps. Its learning rate climbs to 1.0 by the last step
    (warmup over 29 of 30), far too high: the model gets worse after its early evals, so the
    best checkpoint is not the latest one."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    trainformer("train", "--run-dir", str(run_dir), *TINY, "--set", f"data.corpus={corpus_file}",
                "--set", f"tokenizer.vocab_file={vocab_dir / 'vocab.txt'}", "--set", f"train.steps={STEPS}",
                "--set", "train.eval_every=5", "--set", "train.learning_rate=1.0", "--set", "train.warmup_steps=29")
    return run_dir


def evaluate(run_dir, *args) -> dict:
    return json.loads(in_process("eval", str(run_dir), "--json", *args).stdout)


@pytest.fixture(scope="module")
def latest(run) -> dict:
    """`eval --json`: the latest checkpoint on the valid split."""
    return evaluate(run)


def valid_losses(run_dir) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_metrics(run_dir) if m.get("split") == "valid"}


def test_best_is_the_eval_with_the_lowest_valid_loss(run):
    losses = valid_losses(run)
    assert sorted(losses) == [5, 10, 15, 20, 25, 30]
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    lowest = min(losses, key=losses.get)
    assert best["step"] == lowest and best["valid_loss"] == pytest.approx(losses[lowest], rel=1e-9)
    assert best["path"].endswith(f"best/best-{lowest}")
    assert lowest != STEPS  # so best and latest are different checkpoints below


def test_eval_json_prints_the_eight_keys_of_the_latest_checkpoint(run, latest):
    result = latest
    assert set(result) == KEYS
    assert result["step"] == STEPS and result["split"] == "valid"
    assert result["checkpoint"].endswith(f"checkpoints/ckpt-{STEPS}")
    logged = next(m for m in read_metrics(run) if m.get("split") == "valid" and m["step"] == STEPS)
    assert result["loss"] == pytest.approx(logged["loss"], rel=1e-5)  # the run's own last eval
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-9)
    # the same fixed cloze targets: the same count and baseline; a near-tie may flip one answer
    assert isinstance(result["num_targets"], int) and result["num_targets"] == logged["num_targets"] > 1000
    assert result["baseline_accuracy"] == logged["baseline_accuracy"]
    assert result["masked_accuracy"] == pytest.approx(logged["masked_accuracy"], abs=1 / result["num_targets"])


def test_eval_checkpoint_best_scores_the_best_checkpoint(run, latest):
    best = json.loads((run / "checkpoints" / "best.json").read_text())
    result = evaluate(run, "--checkpoint", "best")
    assert set(result) == KEYS
    assert result["step"] == best["step"] and result["checkpoint"].endswith(f"best/best-{best['step']}")
    # The same fixed cloze targets as the eval that made it the best: the same loss.
    assert result["loss"] == pytest.approx(best["valid_loss"], rel=1e-5)
    assert result["loss"] < latest["loss"]


def expected_targets(documents, tokenizer) -> int:
    """round(mask_rate * n) targets in each window of n non-special tokens."""
    windows = pack(tokenize_documents(tokenizer, documents), SEQ_LEN)
    return int(sum(round(MASK_RATE * int(np.sum(window >= NUM_SPECIAL))) for window in windows))


def test_eval_split_train_scores_the_training_windows(run, latest, corpus_file, tokenizer):
    split = load_corpus(str(corpus_file), 0.05)
    valid = latest
    train = evaluate(run, "--split", "train")
    assert set(train) == KEYS and train["split"] == "train" and train["step"] == STEPS
    expected = {name: expected_targets(documents, tokenizer) for name, documents in
                (("valid", split.valid), ("train", split.train))}
    assert {"valid": valid["num_targets"], "train": train["num_targets"]} == expected
    assert train["loss"] != valid["loss"]


SCORE = {"accuracy": 0.5, "step": 40, "split": "test"}


def test_a_score_that_cannot_be_recorded_is_still_given(tmp_path):
    (tmp_path / "eval" / "scores.jsonl").mkdir(parents=True)  # not a file: appending fails, even for root
    said = []
    record_score(RunDir(tmp_path), {**SCORE, "checkpoint": str(tmp_path / "checkpoints" / "ckpt-40")}, [], said.append)
    assert said == [f"trainformer: warning: {RunDir(tmp_path).scores_file}: this score is not recorded (Is a directory)"]


def test_a_broken_score_line_is_named_and_kept(tmp_path):
    scores = RunDir(tmp_path).scores_file
    scores.parent.mkdir()
    scores.write_text('{"split": "test", "step": 40, "checkpoint": "checkpoints/ckpt-40"}\n{"split": "te\n')
    said = []
    record_score(RunDir(tmp_path), {**SCORE, "checkpoint": str(tmp_path / "checkpoints" / "ckpt-40")}, [], said.append)
    assert said == [f"trainformer: warning: {scores}:2: not a JSON record (Unterminated string starting at)"]
    lines = scores.read_text().splitlines()
    assert len(lines) == 3 and lines[1] == '{"split": "te' and json.loads(lines[2])["checkpoint"] == "checkpoints/ckpt-40"
