"""`trainformer train`: every check that can fail, before anything is written; then the run.

What a user can get wrong (a run directory that is a file or belongs to something else, a
config that does not match the run, a missing or changed corpus, a busy metrics port, a run
already in progress) is found here in seconds, without TensorFlow, and nothing in the run
directory is touched. Then the run directory is locked for the whole run and the task trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from trainformer.config import ExperimentConfig
from trainformer.run_dir import RunDir
from trainformer.tasks import load_source


def writes_run_dir() -> bool:
    """Whether this process is the one that writes the run directory: always, except a
    non-chief worker of a cluster (TF_CONFIG: the `chief` task, else worker 0)."""
    try:
        tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except json.JSONDecodeError:
        return True  # make_strategy reports the bad TF_CONFIG
    task, cluster = tf_config.get("task", {}), tf_config.get("cluster", {})
    if task.get("type") == "chief" or not task:
        return True
    return task.get("type") == "worker" and task.get("index") == 0 and not cluster.get("chief")


def start_training(config: ExperimentConfig, run: RunDir, metrics_port: int | None = None, out=sys.stdout) -> dict:
    """Check, lock the run directory, train (or resume); returns session.train's result."""
    chief = writes_run_dir()
    if chief:
        run.check_usable()
        run.check_resume(config)
    if not run.has_checkpoint():  # a resumed run has its weights already
        run.check_init_from(config)
    source = load_source(config)
    if chief:
        run.check_same_data(source.source, source.fingerprint, source.num_examples)
        if config.train.distill_from and not run.has_checkpoint():  # a resumed run has its teachers' answers
            run.check_teachers(config, source.fingerprint, list(source.labels))
    with contextlib.ExitStack() as stack:
        exporter = None
        if metrics_port and chief:
            from trainformer.train.prometheus import PrometheusExporter

            exporter = PrometheusExporter(metrics_port)
            stack.callback(exporter.close)
        if chief:
            stack.enter_context(run.lock())
            run.check_resume(config)  # again: another process may have trained it meanwhile
        from trainformer.run.session import train  # TensorFlow loads here

        return train(config, run, source, out=out, exporter=exporter)


def interrupted_line(run: RunDir) -> str:
    """What a Ctrl-C that stopped training at once (before the loop took over Ctrl-C, or a
    second one) leaves behind: the last checkpoint, or nothing to resume from."""
    if run.has_checkpoint():
        return (f"interrupted: stopped at once without saving; rerun the same command to resume from the last "
                f"checkpoint ({run.resume_command()})")
    return ("interrupted before the first checkpoint: nothing was saved, so rerunning the same command "
            "starts the run over")
