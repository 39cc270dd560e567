"""Does every exported artifact answer what the Keras model answers?

On the run's held-out batches (the eval batches of its valid split), each artifact's ids-in
function is run on the same token ids as the Keras model: the largest absolute logit
difference, the share of identical predictions (argmax of each logits row) and the task's own
accuracy on those batches. The text-in SavedModel signature is checked against the in-process
serving function on texts made from the same ids.

A seq2seq run's answer is a decoded text, not logits: its SavedModel is checked against
`trainformer predict` (the in-process serving function) on the first SEQ2SEQ_SOURCES sources
of the valid split, output token for token, the n-best too, and the scores.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from trainformer.errors import UserError
from trainformer.tokens import SEP_ID

MAX_EXAMPLES = 256  # held-out rows per check: enough to see a disagreement, seconds on a CPU
FLOAT32_TOLERANCE = 1e-4  # max |logit difference| of an unquantized artifact
SEQ2SEQ_SOURCES = 64  # a beam search over 64 sources takes seconds on a CPU for a tiny model


def held_out_inputs(task, names: list[str]) -> list[tuple[dict[str, np.ndarray], dict]]:
    """The first valid eval batches up to MAX_EXAMPLES rows, as (ids-in inputs, targets)."""
    batches, rows = [], 0
    for inputs, targets in task.eval_batches("valid"):
        batches.append(({name: inputs[name].numpy().astype(np.int32) for name in names}, targets))
        rows += len(batches[-1][0][names[0]])
        if rows >= MAX_EXAMPLES:
            break
    return batches


def runners(out: Path, files: dict[str, str], saved_model) -> dict[str, callable]:
    """artifact name -> run(inputs) -> {"logits": ...}, for each artifact written
    (saved_model: the loaded SavedModel, or None)."""
    found = {}
    for name, file in files.items():
        path = out / file
        if name == "saved_model":
            found[name] = _saved_model_runner(saved_model)
        elif name.startswith("tflite"):
            found[name] = _tflite_runner(path)
        elif name == "onnx":
            found[name] = _onnx_runner(path)
    return found


def _saved_model_runner(saved_model):
    signature = saved_model.signatures["serve_ids"]
    return lambda inputs: signature(**{name: tf.constant(value) for name, value in inputs.items()})


def _tflite_runner(path: Path):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner()  # resizes its inputs per call
    return lambda inputs: runner(**inputs)


def _onnx_runner(path: Path):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return lambda inputs: dict(zip(names, session.run(None, inputs)))


def check(task, serving, out: Path, files: dict[str, str]) -> dict:
    """{"examples", "split", "artifacts": {name: {max_abs_logit_diff, agreement, accuracy}},
    "text_max_abs_diff"} with the Keras model (the in-process serving.ids) as the first row;
    a seq2seq run's: check_outputs. out: the folder holding the artifacts (the SavedModel at
    its top)."""
    if task.config.task.type == "seq2seq":
        return check_outputs(task, serving, tf.saved_model.load(str(out)))
    names = [spec.name for spec in serving.ids.input_signature]
    batches = held_out_inputs(task, names)

    def logits_of(run) -> list[np.ndarray]:
        return [np.asarray(run(inputs)["logits"], np.float32) for inputs, _ in batches]

    reference = logits_of(lambda inputs: serving.ids(**inputs))
    saved_model = tf.saved_model.load(str(out)) if "saved_model" in files else None
    results = {"keras": _score(task, batches, reference, reference)}
    for name, run in runners(out, files, saved_model).items():
        results[name] = _score(task, batches, logits_of(run), reference)
    checked = {"split": "valid", "examples": int(sum(len(inputs[names[0]]) for inputs, _ in batches)),
               "artifacts": results}
    if saved_model is not None:
        texts = texts_of(task.tokenizer, batches[0][0]["token_ids"])
        checked["text_max_abs_diff"] = check_text(serving, saved_model, texts)
    return checked


def check_outputs(task, serving, saved_model) -> dict:
    """{"split", "examples", "against": "predict", "artifacts": {"saved_model": {same_output,
    same_nbest, max_abs_score_diff}}}: the SavedModel's serving_default against the in-process
    text function `trainformer predict` answers with, on the valid split's first sources.
    same_output: the share of sources whose output ids are identical; same_nbest: whose every
    hypothesis is (1.0 under greedy decoding, which has none)."""
    sources = task.texts["valid"]["sources"][:SEQ2SEQ_SOURCES]
    if not sources:
        raise UserError("export: this run has no valid pairs to check the export against predict on")
    batch = tf.constant(sources)
    theirs = {key: value.numpy() for key, value in saved_model.signatures["serving_default"](text=batch).items()}
    ours = {key: value.numpy() for key, value in serving.text(batch).items()}
    same = (theirs["output_ids"] == ours["output_ids"]).all(axis=-1) & (theirs["output"] == ours["output"])
    same_nbest = (theirs["outputs"] == ours["outputs"]).all(axis=-1) if "outputs" in ours else same
    scores = [key for key in ("score", "scores") if key in ours]
    row = {"same_output": float(same.mean()), "same_nbest": float(same_nbest.mean()),
           "max_abs_score_diff": max(float(np.abs(theirs[key] - ours[key]).max()) for key in scores)}
    return {"split": "valid", "examples": len(sources), "against": "predict", "artifacts": {"saved_model": row}}


def _score(task, batches, logits: list[np.ndarray], reference: list[np.ndarray]) -> dict:
    """The task's accuracy from logits, and how far they are from the reference's."""
    correct = count = largest = 0.0
    same = rows = 0
    for (_, targets), ours, theirs in zip(batches, logits, reference):
        sums = task.loss_sums(tf.constant(ours), targets)
        correct, count = correct + float(sums["correct"]), count + float(sums["count"])
        largest = max(largest, float(np.abs(ours - theirs).max()))
        predictions, expected = ours.argmax(-1), theirs.argmax(-1)
        same, rows = same + int((predictions == expected).sum()), rows + predictions.size
    return {"max_abs_logit_diff": largest, "agreement": same / rows if rows else 1.0,
            "accuracy": correct / max(count, 1.0)}


def check_text(serving, saved_model, texts: list[str]) -> float:
    """Largest difference between the SavedModel's text-in answer and the in-process one, over
    every float output (classify: logits, probabilities; mlm: scores)."""
    batch = tf.constant(texts)
    theirs, ours = saved_model.signatures["serving_default"](text=batch), serving.text(batch)
    return max(float(np.abs(theirs[key].numpy() - ours[key].numpy()).max())
               for key in ours if ours[key].dtype == tf.float32)


def failures(parity: dict, quantized: tuple[str, ...]) -> list[str]:
    """Unquantized artifacts that differ from the Keras model by more than FLOAT32_TOLERANCE or
    predict differently: each one line."""
    lines = []
    for name, row in parity["artifacts"].items():
        if name == "keras" or any(name.endswith(q) for q in quantized):
            continue
        if "same_output" in row:
            lines += _output_failure(name, row)
        elif row["max_abs_logit_diff"] > FLOAT32_TOLERANCE or row["agreement"] < 1.0:
            lines.append(f"{name}: max |logit difference| {row['max_abs_logit_diff']:.2e}, "
                         f"{row['agreement']:.2%} same predictions")
    return lines


def _output_failure(name: str, row: dict) -> list[str]:
    """A seq2seq artifact must decode every source to the very tokens predict does."""
    if row["same_output"] < 1.0 or row["same_nbest"] < 1.0 or row["max_abs_score_diff"] > FLOAT32_TOLERANCE:
        return [f"{name}: {row['same_output']:.2%} same outputs, {row['same_nbest']:.2%} same n-best, "
                f"max |score difference| {row['max_abs_score_diff']:.2e}"]
    return []


def texts_of(tokenizer, token_ids: np.ndarray) -> list[str]:
    """Texts that tokenize back to (nearly) these `[CLS] ... [SEP]` rows: pieces joined by
    spaces, `##` continuations glued on; [PAD], [UNK], [CLS], [SEP] dropped, [MASK] kept."""
    texts = []
    for row in token_ids:
        words = []
        for piece in (tokenizer.vocab[i] for i in row if i > SEP_ID):
            if piece.startswith("##") and words:
                words[-1] += piece[2:]
            else:
                words.append(piece)
        texts.append(" ".join(words))
    return texts


def report_lines(parity: dict) -> list[str]:
    """The parity table `trainformer export` prints."""
    if parity.get("against") == "predict":
        lines = [f"{'artifact':15s} {'same output':>12s} {'same n-best':>12s} {'max |dscore|':>12s}   "
                 f"({parity['examples']} {parity['split']} sources, against trainformer predict)"]
        return lines + [f"{name:15s} {row['same_output']:12.2%} {row['same_nbest']:12.2%} "
                        f"{row['max_abs_score_diff']:12.2e}" for name, row in parity["artifacts"].items()]
    lines = [f"{'artifact':15s} {'max |dlogit|':>12s} {'same answer':>12s} {'accuracy':>9s}   "
             f"({parity['examples']} {parity['split']} examples)"]
    for name, row in parity["artifacts"].items():
        lines.append(f"{name:15s} {row['max_abs_logit_diff']:12.2e} {row['agreement']:12.2%} {row['accuracy']:9.2%}")
    if "text_max_abs_diff" in parity:
        lines.append(f"saved_model text in vs in-process: max |difference| {parity['text_max_abs_diff']:.2e}")
    return lines
