"""Tasks: what differs between masked-LM pretraining and classification.

The Trainer, checkpoints, strategies and monitor are written once (train/, the engine), the run
directory once (run_dir.py), and run/ puts a task together with them; a task owns the rest (DESIGN.md "Tasks", after Model Garden's Task, kept smaller):

    task = task_for(config)                 # tasks/mlm.py MaskedLMTask, tasks/electra.py ElectraTask,
                                            # tasks/classify.py ClassifyTask
    task.prepare(run, source, say)          # vocabulary, tokenized (cached) examples
    model = task.build_model()              # under the strategy's scope
    task.loss_sums(outputs, targets)        # {"loss_sum", "correct", "count"}: the Trainer's step
    task.train_batches(start_batch)         # global batches, batch n a pure function of (seed, n)
    evaluate = task.evaluator(model)        # evaluate("valid") -> metrics with "loss"
    task.eval_line(metrics), task.summary_lines(), task.result_lines(final), task.manifest_data()
    task.eval_batches(split)                # the fixed held-out (inputs, targets) batches evaluate scores
    task.on_eval(monitor, step, metrics)    # e.g. a confusion matrix image, seq2seq's outputs file
    task.save_outputs(step)                 # text generators only (seq2seq): eval/<split>-<step>.jsonl
    task.learning_rate_multipliers(model)   # classify only: {variable path: factor} of train.layer_decay
    serving = task.serving(model)           # in-graph answers: text(texts), ids(...), exported_functions()
    serving.answer(texts)                   # one dict per text: what `trainformer predict` prints

tasks/seq2seq.py Seq2SeqTask (translation, summarization) generates text with model/search.py.

`accuracy_name` names the accuracy the Trainer logs; `unit`/`items_per_step` its throughput
(None: loss_sums also returns `items`, counted per batch);
`shape_generic` asks for one shape-generic trace of the train step (batches of varying shape).
A task never imports the engine (train/) or run orchestration (run/), nor another task, bar one:
tasks/electra.py ElectraTask extends MaskedLMTask (the same windows and masks, another objective).
What several tasks share lives beside them: tasks/losses.py (label smoothing), tasks/serving.py,
tasks/text_scores.py, tasks/vocabulary.py.
"""

from __future__ import annotations

import importlib

from trainformer.config import ExperimentConfig

TASKS = {"mlm": "MaskedLMTask", "electra": "ElectraTask", "classify": "ClassifyTask", "seq2seq": "Seq2SeqTask"}
DTYPE_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def dtype_policy(precision: str) -> str:
    """The Keras dtype policy of a resolved `train.precision` (fp32, bf16, fp16). Whoever builds
    a task resolves "auto" for the machine first (train.precision.resolved): a task never asks
    the engine."""
    if precision not in DTYPE_POLICIES:
        raise ValueError(f"train.precision {precision!r} must be resolved before a task builds a model")
    return DTYPE_POLICIES[precision]


def load_source(config: ExperimentConfig):
    """The task's data read, cleaned and split, without TensorFlow: a Corpus (mlm), a
    LabelledCorpus (classify) or a ParallelCorpus (seq2seq). Raises UserError naming what is
    wrong with it."""
    d = config.data
    if config.task.type == "seq2seq":
        from trainformer.data.parallel import load_parallel

        return load_parallel(d.corpus, d.valid_fraction, d.test_fraction)
    if config.task.type == "classify":
        from trainformer.data.labelled import load_labelled

        return load_labelled(d.corpus, d.valid_fraction, d.test_fraction)
    from trainformer.data.corpus import load_corpus

    return load_corpus(d.corpus, d.valid_fraction, d.test_fraction)


def task_for(config: ExperimentConfig):
    """The task object of config.task.type (its module loads TensorFlow)."""
    module = importlib.import_module(f"trainformer.tasks.{config.task.type}")
    return getattr(module, TASKS[config.task.type])(config)
