"""Writing an imported model as a new run directory, all or nothing.

Everything is checked and computed in memory first, written into a hidden sibling folder,
and renamed into place at the end: an error or a crash leaves no half run, and an existing
non-empty RUN_DIR is refused (an import writes a new run, never over one).

    config.yaml      a full ExperimentConfig
    manifest.json    what the import says about itself (imported_from, ...) and the environment
    tokenizer/       vocab.txt + tokenizer.json, as train writes them
    checkpoints/     ckpt-0.* and `checkpoint`, found by tf.train.latest_checkpoint, holding
                     model (the MaskedLM), pooler (a Dense d_model, tanh) and step (0)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import keras
import tensorflow as tf

from trainformer.config import ExperimentConfig
from trainformer.data.tokenizer import _write_vocab
from trainformer.errors import UserError
from trainformer.model.heads import MaskedLM
from trainformer.run_dir import RunDir
from trainformer.train.checkpoint import Checkpoints


def check_new_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: is a file, not a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise UserError(f"--run-dir {run_dir}: exists and is not empty; an import writes a new run: pass a new or "
                        f"empty directory")


def write_run(run_dir: Path, config: ExperimentConfig, vocab: list[str], lowercase: bool, model: MaskedLM,
              pooler: keras.layers.Dense, manifest: dict) -> str:
    """Write the run into a hidden sibling folder, then rename it to run_dir; returns the
    checkpoint's file prefix relative to checkpoints/."""
    check_new_run_dir(run_dir)  # again: time has passed
    run_dir = run_dir.absolute()
    staging = run_dir.parent / f".{run_dir.name}.importing-{os.getpid()}"
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # a crashed import of this process id
        run = RunDir(staging)
        run.prepare(config)  # config.yaml
        _write_vocab(run.tokenizer_dir, vocab, lowercase)  # vocab.txt + tokenizer.json, as train writes them
        step = tf.Variable(0, dtype=tf.int64)
        path = Checkpoints(run.checkpoints_dir, 1, model=model, pooler=pooler, step=step).save(0)
        run.write_manifest(manifest)
        check_new_run_dir(run_dir)
        if run_dir.is_dir():
            run_dir.rmdir()  # empty: checked above
        os.rename(staging, run_dir)  # the checkpoint state file holds relative paths
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"--run-dir {run_dir}: cannot be written ({err.strerror or err})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Path(path).name
