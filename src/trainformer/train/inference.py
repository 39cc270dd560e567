"""Using a run's model outside training: `trainformer eval` and `trainformer predict`."""

from __future__ import annotations

from pathlib import Path

from trainformer.tasks import load_source, task_for
from trainformer.train.checkpoint import find_checkpoint, restore_model
from trainformer.train.run_dir import RunDir
from trainformer.train.strategy import make_strategy


def load_run(run_dir: Path, which: str = "latest"):
    """(task, model, checkpoint path, step) of a run's latest or best checkpoint. The task's
    data comes from the run's cache, so the corpus may have moved since training; only a run
    whose cache was deleted reads its corpus again."""
    run = RunDir(run_dir)
    config = run.load_config()
    path = find_checkpoint(run.checkpoints_dir, which)
    task = task_for(config)
    if not task.prepare_from_cache(run):
        task.prepare(run, load_source(config), say=lambda text: None, may_create_vocabulary=False)
    with make_strategy("one_device").scope():
        model = task.build_model()
    return task, model, path, restore_model(model, path)


def evaluate(run_dir: Path, split: str = "valid", which: str = "latest") -> dict:
    """Score a run's checkpoint on a split with its task's metrics."""
    task, model, path, step = load_run(run_dir, which)
    return {**task.evaluator(model)(split), "step": step, "split": split, "checkpoint": path}


def predictor(run_dir: Path, which: str = "latest"):
    """answer(texts) -> one dict per text: the task's answer (classify: label and
    probabilities; mlm: the top tokens for each [MASK]). The model loads once."""
    task, model, _, _ = load_run(run_dir, which)
    return lambda texts: task.predict(model, list(texts))
