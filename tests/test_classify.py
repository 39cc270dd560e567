"""Classification end to end through the real command line: a tiny masked-LM run on the texts of
the real chatterbot intent set's train split, then a classifier fine-tuned from it on that set;
eval, predict, resume, and the checks that guard a start from another run."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from cli_helpers import ENV, INTENT_SPLIT, TINY, in_process, read_metrics, stop_after_line, trainformer

from trainformer.config import load_config
from trainformer.data.labelled import load_labelled
from trainformer.model.heads import build_classifier, build_masked_lm
from trainformer.run.inference import load_run
from trainformer.run.session import start_from_pretrained
from trainformer.run_dir import RunDir, resolve_train_config
from trainformer.train.checkpoint import Checkpoints, restore_pretrained

INTENTS = ["--set", "task.type=classify", *INTENT_SPLIT]


# Every fine-tuning key at once (train.keep_best, train.layer_decay, model.pooling,
# data.input_mask_rate, train.ema, train.rdrop, train.noisy_tune), deterministic with dropout: the
# kept_best fixture stops a run with these same arguments, resumes it, and compares it with the
# finetuned fixture bit for bit (one uninterrupted run serves both; the resumed run must not
# draw NoisyTune's noise again).
FINE_TUNING = ["--set", "train.keep_best=true", "--set", "train.layer_decay=0.8", "--set", "model.pooling=mean",
               "--set", "data.input_mask_rate=0.15", "--set", "train.ema=0.9", "--set", "train.rdrop=1",
               "--set", "train.noisy_tune=0.15",
               "--set", "train.steps=40", "--set", "train.eval_every=10", "--set", "train.deterministic=true",
               "--set", "model.dropout=0.1", "--set", "train.precision=fp32"]


def fine_tuning_args(intent_pretraining) -> list[str]:
    return [*TINY, *INTENTS, "--set", f"model.init_from={intent_pretraining}", *FINE_TUNING]


@pytest.fixture(scope="module")
def finetuned(intent_pretraining, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("intent") / "run"
    result = trainformer("train", "--run-dir", str(run_dir), *fine_tuning_args(intent_pretraining))
    return run_dir, result.stdout, result.stderr


def test_bench_of_a_fine_tune_times_the_model_of_its_init_from(finetuned, intent_pretraining, tmp_path):
    result = in_process("bench", "zh-intent", "--set", f"model.init_from={intent_pretraining}", "--steps", "1",
                         "--cache-dir", str(tmp_path), "--json")
    _, model, _, _ = load_run(finetuned[0])
    assert json.loads(result.stdout.splitlines()[-1])["num_params"] == model.count_params()  # TINY's sizes


def test_a_classifier_starts_from_the_pretraining_run(finetuned, intent_pretraining):
    run_dir, stdout, stderr = finetuned
    assert stderr == ""  # the optimizer and MLM head left behind are not listed as "unrestored values"
    assert f"from model.init_from={intent_pretraining}" in stdout  # its vocabulary
    assert f"encoder: from {intent_pretraining}/checkpoints/ckpt-20" in stdout
    assert "encoder: each weight tensor + uniform noise of width 0.15 x its standard deviation" in stdout
    vocabulary = (intent_pretraining / "tokenizer" / "vocab.txt").read_text()
    assert (run_dir / "tokenizer" / "vocab.txt").read_text() == vocabulary
    labels = json.loads((run_dir / "labels.json").read_text())
    assert len(labels) == 17 and "greetings" in labels
    progress = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert progress and all(" acc " in line and " ex/s" in line and "data-wait" in line for line in progress)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["task"] == "classify" and manifest["data"]["labels"] == labels
    assert set(manifest["data"]["class_counts"]["test"]) == set(labels)  # every class in every split


def test_eval_json_of_a_classify_run(finetuned):
    run_dir = finetuned[0]
    result = json.loads(in_process("eval", str(run_dir), "--split", "test", "--json").stdout)
    assert {"accuracy", "macro_f1", "per_class", "support", "baseline_accuracy", "num_examples", "split",
            "step", "loss", "confusion"} <= set(result)
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert result["split"] == "test" and result["step"] == best["step"]  # keep_best: the best checkpoint
    assert sum(result["support"].values()) == result["num_examples"] == np.sum(result["confusion"])
    correct = np.trace(result["confusion"])
    assert result["accuracy"] == pytest.approx(correct / result["num_examples"])
    f1s = [row["f1"] for row in result["per_class"].values()]
    assert result["macro_f1"] == pytest.approx(np.mean(f1s)) and len(f1s) == 17
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["final_eval"]["num_examples"] == sum(manifest["data"]["class_counts"]["valid"].values())


def test_eval_keeps_its_scores_and_says_when_test_is_scored_again(finetuned):
    run_dir = finetuned[0]
    scores = run_dir / "eval" / "scores.jsonl"
    before = len(scores.read_text().splitlines()) if scores.exists() else 0
    valid = in_process("eval", str(run_dir), "--json")
    test = in_process("eval", str(run_dir), "--split", "test", "--json")
    again = in_process("eval", str(run_dir), "--split", "test", "--json")
    said = "this checkpoint was scored on the test split before"
    assert said not in valid.stderr and said in again.stderr  # (test's own stderr says it if another test scored first)
    records = [json.loads(line) for line in scores.read_text().splitlines()][before:]
    assert [record["split"] for record in records] == ["valid", "test", "test"]
    for record, printed in zip(records, (valid, test, again)):
        result = json.loads(printed.stdout)
        assert record["accuracy"] == result["accuracy"] and record["step"] == result["step"]
        assert record["checkpoint"] == f"checkpoints/best/best-{result['step']}"  # relative: the run may move
        assert record["time"].endswith("+00:00")


def test_predict_prints_one_json_line_per_text(finetuned):
    run_dir = finetuned[0]
    labels = json.loads((run_dir / "labels.json").read_text())
    result = subprocess.run([sys.executable, "-m", "trainformer", "predict", str(run_dir)], env=ENV,
                            input="你好\n\n今天天气怎么样\n", capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["text"] for line in lines] == ["你好", "今天天气怎么样"]  # the empty line is skipped
    for line in lines:
        assert line["label"] in labels and set(line["probabilities"]) == set(labels)
        assert sum(line["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
        assert line["probability"] == max(line["probabilities"].values())


def test_confusion_matrix_image_in_tensorboard(finetuned):
    run_dir = finetuned[0]
    tags = set()
    for path in (run_dir / "logs" / "valid").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags |= {value.tag for value in event.summary.value}
    assert "confusion_matrix" in tags and "accuracy" in tags and "macro_f1" in tags


def test_predict_fills_masks_on_a_pretraining_run(intent_pretraining):
    [line] = in_process("predict", str(intent_pretraining), "人民[MASK]报").stdout.splitlines()
    masks = json.loads(line)["masks"]
    assert len(masks) == 1 and len(masks[0]) == 5
    assert masks[0][0]["probability"] >= masks[0][-1]["probability"]


def test_an_encoder_of_another_shape_is_refused_before_anything_is_written(intent_pretraining, tmp_path):
    result = trainformer("train", "--run-dir", str(tmp_path / "run"), *TINY, *INTENTS, "--set", "model.d_model=64",
                         "--set", f"model.init_from={intent_pretraining}", check=False)
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    assert f"model.d_model: 64 here but 32 in model.init_from={intent_pretraining}; leave it out to take the source's" \
        in result.stderr


def test_a_fine_tune_naming_only_init_from_takes_the_encoder_sizes_of_that_run(intent_pretraining, tmp_path):
    """No size given (the finetuned fixture gives TINY's, which agree): the run's are the
    pretraining run's, in its config.yaml, which loading the run and resuming it read."""
    run_dir = tmp_path / "run"
    stdout = trainformer("train", "--run-dir", str(run_dir), *INTENTS, "--set", "data.seq_len=32",
                         "--set", "train.batch_size=16", "--set", "train.steps=2", "--set", "train.warmup_steps=1",
                         "--set", f"model.init_from={intent_pretraining}").stdout
    assert "model: classify, 1 layers, d_model 32, 2 heads, dff 64, pre-LN" in stdout
    assert f"encoder: from {intent_pretraining}/checkpoints/ckpt-20" in stdout
    m = RunDir(run_dir).load_config().model
    assert (m.d_model, m.num_layers, m.num_heads, m.dff, m.dropout) == (32, 1, 2, 64, 0.0)  # dropout: not a size
    _, classifier, _, step = load_run(run_dir)
    assert step == 2 and (classifier.encoder.d_model, classifier.encoder.num_layers) == (32, 1)
    config, run = resolve_train_config(None, ["train.steps=4"], run_dir)  # trainformer train --run-dir RUN
    run.check_resume(config)


def test_a_start_from_a_run_that_split_the_same_set_otherwise_is_refused(intent_pretraining, tmp_path):
    """The pretraining run read the intent set's train texts: a classify run splitting that set
    alike starts from it (the finetuned fixture), one splitting it otherwise would score texts the
    encoder saw."""
    result = trainformer("train", "--run-dir", str(tmp_path / "other"), *TINY, *INTENTS, "--set",
                         "data.test_fraction=0.2", "--set", f"model.init_from={intent_pretraining}", check=False)
    assert result.returncode == 2 and not (tmp_path / "other").exists()
    assert result.stderr.strip().endswith("(set data.valid_fraction=0.1 data.test_fraction=0.1)")


def test_restore_pretrained_loads_the_encoder_and_leaves_the_head(tmp_path):
    config = load_config(None, ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.dff=64"])
    keras.utils.set_random_seed(1)
    masked_lm = build_masked_lm(config.model, 100, 32)
    Checkpoints(tmp_path, 1, model=masked_lm, step=tf.Variable(0, dtype=tf.int64)).save(3)
    keras.utils.set_random_seed(2)
    classifier = build_classifier(config.model, 100, 32, num_labels=3)
    head_before = [w.numpy() for w in classifier.head.weights]
    restore_pretrained(classifier, tmp_path)
    for ours, theirs in zip(classifier.encoder.weights, masked_lm.encoder.weights):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    for before, after in zip(head_before, classifier.head.weights):
        np.testing.assert_array_equal(before, after.numpy())


def test_noisy_tune_perturbs_the_encoder_a_fine_tune_starts_from_and_leaves_the_head(tmp_path):
    """session.start_from_pretrained with train.noisy_tune: the encoder is the source's plus
    noise inside 0.15 / 2 of each tensor's spread; the fresh head is left as built."""
    config = load_config(None, ["model.d_model=32", "model.num_layers=1", "model.num_heads=2", "model.dff=64",
                                f"model.init_from={tmp_path}", "train.noisy_tune=0.15"])
    keras.utils.set_random_seed(1)
    masked_lm = build_masked_lm(config.model, 100, 32)
    Checkpoints(tmp_path / "checkpoints", 1, model=masked_lm, step=tf.Variable(0, dtype=tf.int64)).save(3)
    classifier = build_classifier(config.model, 100, 32, num_labels=3)
    head_before = [w.numpy() for w in classifier.head.weights]
    said = []
    start_from_pretrained(config, classifier, said.append)
    assert "train.noisy_tune, NoisyTune" in said[-1]
    for ours, theirs in zip(classifier.encoder.weights, masked_lm.encoder.weights):
        spread, moved = theirs.numpy().std(), np.abs(ours.numpy() - theirs.numpy()).max()
        assert moved <= 0.15 / 2 * spread * 1.0001, ours.path
        assert (moved > 0) == (spread > 0), ours.path  # a tensor all alike (a fresh bias) has no spread to scale
    for before, after in zip(head_before, classifier.head.weights):
        np.testing.assert_array_equal(before, after.numpy())


# --- train.distill_from: a student of the finetuned run -------------------------------------------

def test_a_student_trains_on_its_teachers_probabilities_and_resumes_from_the_cache(finetuned, intent_pretraining,
                                                                                   tmp_path):
    teacher, student = finetuned[0], tmp_path / "student"
    args = [*TINY, *INTENTS, "--set", f"model.init_from={intent_pretraining}", "--set", f"train.distill_from={teacher}"]
    stdout = trainformer("train", "--run-dir", str(student), *args, "--set", "train.steps=10").stdout
    best = json.loads((teacher / "checkpoints" / "best.json").read_text())["step"]
    assert f"teacher: {teacher} (step {best}) agrees with " in stdout and "% of the 695 training labels" in stdout
    assert "the loss reads the teachers' probabilities, not the labels" in stdout
    with np.load(student / "cache" / "teachers.npz") as arrays:
        probabilities = arrays["probabilities"]  # (695, 17), rows in the train split's order
    # the rows are the teacher's answers to the train split's texts, in order (asked here through
    # predict's own path: the texts tokenized in its graph, one at a time)
    corpus = load_labelled("chatterbot-zh-intents", 0.1, 0.1)
    answers = [json.loads(line) for line in in_process("predict", str(teacher), *corpus.train.texts[:3]).stdout
               .splitlines()]
    for row, answer in zip(probabilities, answers):
        np.testing.assert_allclose(row, [answer["probabilities"][label] for label in corpus.labels], atol=1e-5)
    resumed = trainformer("train", "--run-dir", str(student), "--set", "train.steps=12").stdout
    assert "teacher:" not in resumed and "the loss reads the teachers' probabilities" in resumed


def test_a_teacher_of_other_data_or_another_task_is_refused_before_anything_is_written(finetuned, intent_pretraining,
                                                                                      tmp_path):
    """A teacher fine-tuned on another split may have trained on this run's valid and test texts."""
    refusals = {str(intent_pretraining): f"train.distill_from: {intent_pretraining} is a mlm run; a teacher is a "
                                         f"classify run",
                str(tmp_path): f"train.distill_from: {tmp_path}: not a run with a checkpoint"}
    for teacher, said in refusals.items():
        result = trainformer("train", "--run-dir", str(tmp_path / "student"), *TINY, *INTENTS,
                             "--set", f"train.distill_from={teacher}", check=False)
        assert result.returncode == 2 and said in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = trainformer("train", "--run-dir", str(tmp_path / "student"), *TINY, *INTENTS,
                         "--set", "data.test_fraction=0.2", "--set", f"train.distill_from={finetuned[0]}", check=False)
    assert result.returncode == 2 and "was fine-tuned on other data (fingerprint" in result.stderr
    assert not (tmp_path / "student").exists()


# --- the fine-tuning keys: train.keep_best, train.layer_decay, model.pooling ---------------------

@pytest.fixture(scope="module")
def kept_best(intent_pretraining, tmp_path_factory):
    """A 40-step fine-tune with all three keys, evaluated every 10 steps, stopped by SIGTERM once
    its first eval was kept as the best, then resumed: (run_dir, stdout of each segment)."""
    run_dir = tmp_path_factory.mktemp("kept_best") / "run"
    first = stop_after_line("new best valid accuracy", "--run-dir", str(run_dir), *fine_tuning_args(intent_pretraining))
    resumed = trainformer("train", "--run-dir", str(run_dir)).stdout
    return run_dir, first, resumed


def valid_accuracies(run_dir) -> dict[int, float]:
    return {m["step"]: m["accuracy"] for m in read_metrics(run_dir) if m.get("split") == "valid"}


def test_keep_best_keeps_the_best_valid_accuracy_across_a_resume(kept_best):
    run_dir, first, resumed = kept_best
    assert "layer decay 0.8: learning rate x1 for the head, x0.8 for the top block" in first
    assert "best checkpoint: by valid accuracy" in first and "the head pools the mean of the tokens" in first
    assert "R-Drop: each text twice, weight 1" in first
    accuracies = valid_accuracies(run_dir)
    assert sorted(accuracies) == [10, 20, 30, 40]  # both segments'
    best_step = max(accuracies, key=accuracies.get)  # the first of equals: a tie does not replace it
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert (best["step"], best["metric"]) == (best_step, "accuracy")
    assert best["value"] == pytest.approx(accuracies[best_step], rel=1e-9)
    assert tf.train.latest_checkpoint(str(run_dir / "checkpoints" / "best")).endswith(f"best-{best_step}")
    assert f"best: valid accuracy {best['value']:.4f} at step {best_step}" in resumed
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["best_eval"]["step"] == best_step and manifest["final_eval"]["step"] == 40


def test_eval_and_predict_use_the_best_checkpoint_and_say_so(kept_best):
    run_dir = kept_best[0]
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    said = f"checkpoint: best (step {best['step']}, valid accuracy {best['value']:.4f})"
    result = in_process("eval", str(run_dir), "--json")
    scores = json.loads(result.stdout)
    assert said in result.stderr and scores["checkpoint"].endswith(f"best/best-{best['step']}")
    assert scores["step"] == best["step"] and scores["accuracy"] == pytest.approx(best["value"], abs=1e-9)
    latest = json.loads(in_process("eval", str(run_dir), "--json", "--checkpoint", "latest").stdout)
    assert latest["step"] == 40 and latest["checkpoint"].endswith("checkpoints/ckpt-40")
    # train.ema: the evaluations (and best/) read the average, a latest checkpoint's model the
    # trained weights themselves (the average resumes from its optimizer)
    logged = {m["step"]: m["loss"] for m in read_metrics(run_dir) if m.get("split") == "valid"}
    assert scores["loss"] == pytest.approx(logged[best["step"]], rel=1e-6)
    assert abs(latest["loss"] - logged[40]) > 1e-4
    predicted = in_process("predict", str(run_dir), "你好")
    assert said in predicted.stderr and json.loads(predicted.stdout)["text"] == "你好"


def test_export_uses_the_best_checkpoint_and_mean_pooling_passes_parity(kept_best, tmp_path):
    """The SavedModel only: mean pooling's TFLite and ONNX forms are left to the export tests."""
    run_dir = kept_best[0]
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    result = in_process("export", str(run_dir), "--out", str(tmp_path / "base"), "--format", "saved_model")
    assert f"checkpoint: best (step {best['step']}, valid accuracy" in result.stdout
    metadata = json.loads((tmp_path / "base" / str(best["step"]) / "metadata.json").read_text())
    assert metadata["step"] == best["step"] and metadata["checkpoint"] == f"checkpoints/best/best-{best['step']}"


def test_the_stopped_fine_tune_resumes_to_the_weights_and_best_of_an_uninterrupted_one(kept_best, finetuned):
    """SIGTERM mid-run, rerun: bitwise the weights of the uninterrupted deterministic run (with
    dropout: its random state resumes too). The factors of layer decay are no state a resume
    could lose, and the best record of the first segment is what the second one has to beat."""
    assert "resuming from checkpoint" in kept_best[2]
    steps = [e["step"] for e in read_metrics(kept_best[0]) if e.get("split") == "train"]
    assert steps == sorted(set(steps))  # no step logged twice across the resume
    runs = (kept_best[0], finetuned[0])
    digests = [json.loads((run_dir / "manifest.json").read_text())["weights_sha256"] for run_dir in runs]
    assert digests[0] == digests[1]
    records = [json.loads((run_dir / "checkpoints" / "best.json").read_text()) for run_dir in runs]
    assert (records[0]["step"], records[0]["value"]) == (records[1]["step"], records[1]["value"])
