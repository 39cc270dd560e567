"""Tasks: what differs between masked-LM pretraining and classification.

The Trainer, checkpoints, strategies, monitor and run directory are written once (train/); a
task owns the rest (DESIGN.md "Tasks", after Model Garden's Task, kept smaller):

    task = task_for(config)                 # tasks/mlm.py MaskedLMTask, tasks/classify.py ClassifyTask
    task.prepare(run, source, say)          # vocabulary, tokenized (cached) examples
    model = task.build_model()              # under the strategy's scope
    task.loss_sums(outputs, targets)        # {"loss_sum", "correct", "count"}: the Trainer's step
    task.train_batches(start_batch)         # global batches, batch n a pure function of (seed, n)
    evaluate = task.evaluator(model)        # evaluate("valid") -> metrics with "loss"
    task.eval_line(metrics), task.summary_lines(), task.result_lines(final), task.manifest_data()
    task.eval_batches(split)                # the fixed held-out (inputs, targets) batches evaluate scores
    task.on_eval(monitor, step, metrics)    # e.g. a confusion matrix image
    serving = task.serving(model)           # in-graph answers: text(texts), ids(...), exported_functions()
    serving.answer(texts)                   # one dict per text: what `trainformer predict` prints

`accuracy_name` names the accuracy the Trainer logs; `unit`/`items_per_step` its throughput.
A task never imports another task.
"""

from __future__ import annotations

import importlib

from trainformer.config import ExperimentConfig

TASKS = {"mlm": "MaskedLMTask", "classify": "ClassifyTask"}
DTYPE_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def load_source(config: ExperimentConfig):
    """The task's data read, cleaned and split, without TensorFlow: a Corpus (mlm) or a
    LabelledCorpus (classify). Raises UserError naming what is wrong with it."""
    if config.task.type == "classify":
        from trainformer.data.labelled import load_labelled

        return load_labelled(config.data.corpus, config.data.valid_fraction, config.data.test_fraction)
    from trainformer.data.corpus import load_corpus

    return load_corpus(config.data.corpus, config.data.valid_fraction)


def task_for(config: ExperimentConfig):
    """The task object of config.task.type (its module loads TensorFlow)."""
    module = importlib.import_module(f"trainformer.tasks.{config.task.type}")
    return getattr(module, TASKS[config.task.type])(config)
