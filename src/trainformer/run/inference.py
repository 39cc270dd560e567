"""Using a run's model outside training: `trainformer eval` and `trainformer predict`."""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from pathlib import Path

from trainformer.config import with_decode_overrides
from trainformer.errors import UserError
from trainformer.files import append_record, read_records
from trainformer.run_dir import RunDir, now
from trainformer.tasks import load_source, task_for
from trainformer.train.checkpoint import choose_checkpoint, restore_chosen
from trainformer.train.precision import resolved
from trainformer.train.strategy import make_strategy


def load_run(run_dir: Path, which: str | None = None, precision: str | None = None, overrides=(), say=None):
    """(task, model, checkpoint path, step) of a run's latest or best checkpoint (which=None:
    the best if the run kept one by valid accuracy, train.keep_best, else the latest; `say`
    hears "checkpoint: best (step N, valid accuracy X)" when that matters). The task's
    data comes from the run's cache, so the corpus may have moved since training; only a run
    whose cache was deleted reads its corpus again. `precision` (e.g. "fp32") builds the model
    in another precision than the run trained in (checkpoints hold float32 weights);
    `overrides` (decode.KEY=VALUE) decode a seq2seq run otherwise than it was trained to."""
    run = RunDir(run_dir)
    config = with_decode_overrides(run.load_config(), overrides)
    if precision:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision))
    config, _ = resolved(config)  # auto -> what this machine computes in (weights are float32 either way)
    path, description = choose_checkpoint(run.checkpoints_dir, which, config.train.keep_best)
    if description and say:
        say(f"checkpoint: {description}")
    task = task_for(config)
    if not task.prepare_from_cache(run):
        task.prepare(run, load_source(config), say=lambda text: None, may_create_vocabulary=False)
    with make_strategy("one_device").scope():
        model = task.build_model()
    path, step = restore_chosen(model, path, run.checkpoints_dir, which, config.train.keep_best)
    return task, model, path, step


def evaluate(run_dir: Path, split: str = "valid", which: str | None = None, overrides=(), say=None) -> dict:
    """Score a run's checkpoint on a split with its task's metrics, and keep the score in the
    run (record_score); a task that generates text also writes its outputs beside the
    references (RUN_DIR/eval/<split>-<step>.jsonl), and tells `say` how far its decoding is."""
    task, model, path, step = load_run(run_dir, which, overrides=overrides, say=say)
    generates_text = hasattr(task, "save_outputs")
    evaluator = task.evaluator(model, progress=say) if generates_text else task.evaluator(model)
    metrics = {**evaluator(split), "step": step, "split": split, "checkpoint": path}
    if generates_text:
        metrics["outputs_file"] = str(task.save_outputs(step))
    record_score(RunDir(run_dir), metrics, list(overrides), say or (lambda text: None))
    return metrics


def record_score(run: RunDir, metrics: dict, overrides: list[str], say) -> None:
    """Append an eval to RUN_DIR/eval/scores.jsonl (when, the checkpoint relative to the run,
    decode overrides, every metric), so a run keeps what it was scored on. The test split
    scored again at the same checkpoint is said: every look at test is a choice made on it.
    A run that cannot be written to (read-only) is scored all the same, with a warning."""
    paths = {key: os.path.relpath(metrics[key], run.root) for key in ("checkpoint", "outputs_file") if key in metrics}
    record = {"time": now(), **metrics, **paths, **({"overrides": overrides} if overrides else {})}
    try:
        earlier = [entry for entry in read_records(run.scores_file) if same_scoring(entry, record)]
    except (UserError, OSError) as err:
        earlier = []
        say(f"trainformer: warning: {err}")
    if earlier and record["split"] == "test":
        say(f"trainformer: note: this checkpoint was scored on the test split before ({len(earlier)}x, first at "
            f"{earlier[0].get('time', '?')}; {run.scores_file}): choose on valid, or test stops being held out")
    try:
        append_record(run.scores_file, record)
    except OSError as err:
        say(f"trainformer: warning: {run.scores_file}: this score is not recorded ({err.strerror})")


def same_scoring(entry: dict, record: dict) -> bool:
    """Whether a recorded eval scored what this one does: the split, checkpoint and decoding."""
    return all(entry.get(key) == record.get(key) for key in ("split", "checkpoint", "overrides"))  # the path names the step


def predictor(run_dir: Path, which: str | None = None, nbest: bool = False, warn=None):
    """answer(texts) -> one dict per text: the task's answer (classify: label and
    probabilities; mlm: the top tokens for each [MASK]; seq2seq: the output text, with nbest
    the beam's hypotheses too), through the same in-graph functions an export saves. The
    model loads once. `warn(line)` hears about answers not to trust (an untrained head)."""
    task, model, _, _ = load_run(run_dir, which, say=warn)
    serving = task.serving(model)
    if nbest and task.config.task.type != "seq2seq":
        raise UserError(f"--nbest: {run_dir} is a {task.config.task.type} run; only seq2seq runs decode with a beam")
    untrained = untrained_head(RunDir(run_dir), task.config.task.type)
    if untrained and warn:
        warn(f"trainformer: warning: {run_dir} was imported without trained {untrained}: its [MASK] fills are "
             f"random guesses until a run trains it (model.init_from={run_dir})")
    options = {"nbest": True} if nbest else {}
    return lambda texts: serving.answer(list(texts), **options)


def untrained_head(run: RunDir, task_type: str) -> str | None:
    """The head predict answers with, when `import hf` started it fresh (the manifest says so)."""
    fresh = run.read_manifest().get("imported_from", {}).get("fresh", [])
    if task_type == "mlm":
        return next((what.split(" (")[0] for what in fresh if what.startswith("MLM head")), None)
    return None


# --- eval as text -------------------------------------------------------------------------------

def format_metrics(result: dict) -> str:
    """`eval` without --json: one `name value` line per scalar, then per-class scores and the
    confusion matrix (classify) as aligned tables."""
    lines = []
    for key, value in result.items():
        if key in ("per_class", "support", "confusion"):
            continue
        lines.append(f"{key:18s} {value:.4f}" if isinstance(value, float) else f"{key:18s} {value}")
    if "per_class" in result:
        lines += ["", *per_class_table(result["per_class"], result.get("support", {}))]
    if "confusion" in result:
        lines += ["", *confusion_table(result["confusion"], list(result.get("per_class", {})))]
    return "\n".join(lines)


def per_class_table(per_class: dict, support: dict) -> list[str]:
    width = max(display_width(label) for label in [*per_class, "label"])
    lines = [f"{pad('label', width)}  precision  recall      f1  support"]
    for label, scores in per_class.items():
        lines.append(f"{pad(label, width)}  {scores['precision']:9.4f}  {scores['recall']:6.4f}  {scores['f1']:6.4f}"
                     f"  {support.get(label, ''):>7}")
    return lines


def confusion_table(confusion: list[list[int]], labels: list[str]) -> list[str]:
    """Rows: the true label, numbered; columns: the predicted one, by the same numbers (a row
    of 17 label names would not fit a terminal)."""
    labels = labels or [str(i) for i in range(len(confusion))]
    names = [f"{i + 1:>2} {label}" for i, label in enumerate(labels)]
    width = max(display_width(name) for name in [*names, "true \\ predicted"])
    cell = max(len(str(value)) for row in confusion for value in [*row, len(confusion)])
    lines = ["confusion (rows: true label; columns: predicted, numbered as the rows)",
             pad("true \\ predicted", width) + " " + " ".join(f"{j + 1:>{cell}}" for j in range(len(confusion)))]
    for name, row in zip(names, confusion):
        lines.append(pad(name, width) + " " + " ".join(f"{value:>{cell}}" for value in row))
    return lines


def display_width(text: str) -> int:
    """Terminal columns: a CJK label's characters take two each."""
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def pad(text: str, width: int) -> str:
    return text + " " * (width - display_width(text))
