"""Using a run's model outside training: `trainformer eval` and `trainformer predict`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainformer.errors import UserError
from trainformer.run_dir import RunDir
from trainformer.tasks import load_source, task_for
from trainformer.train.checkpoint import find_checkpoint, restore_model
from trainformer.train.precision import resolved
from trainformer.train.strategy import make_strategy


def load_run(run_dir: Path, which: str = "latest", precision: str | None = None):
    """(task, model, checkpoint path, step) of a run's latest or best checkpoint. The task's
    data comes from the run's cache, so the corpus may have moved since training; only a run
    whose cache was deleted reads its corpus again. `precision` (e.g. "fp32") builds the model
    in another precision than the run trained in (checkpoints hold float32 weights)."""
    run = RunDir(run_dir)
    config = run.load_config()
    if precision:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision))
    config, _ = resolved(config)  # auto -> what this machine computes in (weights are float32 either way)
    path = find_checkpoint(run.checkpoints_dir, which)
    task = task_for(config)
    if not task.prepare_from_cache(run):
        task.prepare(run, load_source(config), say=lambda text: None, may_create_vocabulary=False)
    with make_strategy("one_device").scope():
        model = task.build_model()
    return task, model, path, restore_model(model, path)


def evaluate(run_dir: Path, split: str = "valid", which: str = "latest") -> dict:
    """Score a run's checkpoint on a split with its task's metrics; a task that generates text
    also writes its outputs beside the references (RUN_DIR/eval/<split>-<step>.jsonl)."""
    task, model, path, step = load_run(run_dir, which)
    metrics = {**task.evaluator(model)(split), "step": step, "split": split, "checkpoint": path}
    if hasattr(task, "save_outputs"):
        metrics["outputs_file"] = str(task.save_outputs(step))
    return metrics


def predictor(run_dir: Path, which: str = "latest", nbest: bool = False):
    """answer(texts) -> one dict per text: the task's answer (classify: label and
    probabilities; mlm: the top tokens for each [MASK]; seq2seq: the output text, with nbest
    the beam's hypotheses too), through the same in-graph functions an export saves. The
    model loads once."""
    task, model, _, _ = load_run(run_dir, which)
    serving = task.serving(model)
    if nbest and task.config.task.type != "seq2seq":
        raise UserError(f"--nbest: {run_dir} is a {task.config.task.type} run; only seq2seq runs decode with a beam")
    options = {"nbest": True} if nbest else {}
    return lambda texts: serving.answer(list(texts), **options)
