"""A distilled classifier's targets (train.distill_from, Hinton et al. 2015): the mean of its
teachers' probabilities for each of its training texts. They are computed once, from each
teacher's checkpoint that eval would score, and kept in the run's cache: a resumed run reads
the targets it started with, whatever has become of its teachers since.

Each teacher reads the texts with its own vocabulary and model, so any classifier fine-tuned on
the same split can teach (a larger encoder, an imported BERT, an ensemble of seeds);
run_dir.check_teachers has refused the others before the run started.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainformer.config import ExperimentConfig, teachers
from trainformer.data.classify_pipeline import save_arrays
from trainformer.run.inference import load_run
from trainformer.run_dir import RunDir

CACHE_FILE = "teachers.npz"  # in the run's cache; train.distill_from cannot change once a run has a checkpoint


def teacher_probabilities(config: ExperimentConfig, run: RunDir, task, say, write: bool) -> np.ndarray:
    """(training texts, labels) float32: the teachers' mean probabilities, rows in task's
    training order and columns in its label order. A run that starts computes them (and
    caches them where `write`: the chief of a cluster computes, the other workers read them
    then); a resumed run reads its cache."""
    path = run.cache_dir / CACHE_FILE
    if path.is_file() and (run.has_checkpoint() or not write):
        with np.load(path) as cached:
            return cached["probabilities"]
    answers = [answers_of(Path(teacher), task, say) for teacher in teachers(config)]
    mean = np.mean(answers, axis=0).astype(np.float32)  # (texts, labels)
    if len(answers) > 1:
        say(f"teachers: their mean agrees with {agreement(mean, task):.2%} of the training labels")
    if write:
        save_arrays(path, {"probabilities": mean})
    return mean


def answers_of(teacher: Path, task, say) -> np.ndarray:
    """(training texts, labels): one teacher's probabilities, in the student's label order."""
    teacher_task, model, _, step = load_run(teacher)
    columns = [teacher_task.labels.index(label) for label in task.labels]
    probabilities = teacher_task.probabilities(model, task.corpus.train.texts)[:, columns]
    say(f"teacher: {teacher} (step {step}) agrees with {agreement(probabilities, task):.2%} of the "
        f"{len(probabilities):,} training labels")
    return probabilities


def agreement(probabilities: np.ndarray, task) -> float:
    return float(np.mean(probabilities.argmax(axis=1) == task.examples["train"]["labels"]))
