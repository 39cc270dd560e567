"""`trainformer average`: a new run whose weights are the mean of another run's last K
checkpoints, to evaluate or to start fine-tunes from (model.init_from).

Latest weight averaging (LAWA; Kaddour 2022, "Stop Wasting My Time! Saving Days of ImageNet and
BERT Training with Latest Weight Averaging"): the mean of checkpoints a few hundred steps apart
lies nearer the middle of the valley the last steps wander in than any one of them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainformer.errors import UserError
from trainformer.run.inference import load_run
from trainformer.run_dir import RunDir
from trainformer.train.checkpoint import Checkpoints, checkpoint_step, kept_checkpoints, restore_model

# What the new run takes from the one it averages: what eval and init_from read besides the
# checkpoint (the config, vocabulary, data cache, a classifier's labels). Its history (metrics,
# logs, eval scores) is of other weights and stays behind.
COPIED = ("config.yaml", "tokenizer", "cache", "labels.json")


def average_run(source: Path, target: Path, last: int, say=print) -> dict:
    """Write run `target`: `source`'s files (COPIED) and one checkpoint, at the newest step,
    whose float weights are the mean of source's last `last` checkpoints (integer state, such
    as dropout seeds, is the newest's). The target is written beside its final name and renamed
    into place, so a crash leaves no half run. Returns what the manifest records."""
    paths = checkpoints_to_average(RunDir(source), last)
    if target.exists():
        raise UserError(f"--run-dir {target}: already exists; averaging writes a new run")
    _, model, _, _ = load_run(source, "latest")
    for variable, mean in zip(model.weights, mean_weights(model, paths)):
        variable.assign(mean)
    step = checkpoint_step(paths[-1])
    averaged = {"from": str(source), "checkpoints": [os.path.basename(path) for path in paths]}

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a crashed earlier attempt's
    partial.mkdir(parents=True)
    for name in COPIED:
        copy(source / name, partial / name)
    RunDir(partial).write_manifest({**RunDir(source).read_manifest(), "averaged": averaged})
    Checkpoints(RunDir(partial).checkpoints_dir, 1, model=model, step=tf.Variable(step, dtype=tf.int64)).save(step)
    os.rename(partial, target)
    say(f"{target}: the mean of {source}'s {', '.join(averaged['checkpoints'])}; start from it with "
        f"--set model.init_from={target}")
    return averaged


def checkpoints_to_average(run: RunDir, last: int) -> list[str]:
    """The paths of a run's last `last` checkpoints, oldest first; a UserError when it keeps fewer."""
    if last < 2:
        raise UserError(f"--last {last}: average at least 2 checkpoints")
    kept = kept_checkpoints(run.checkpoints_dir)
    if len(kept) < last:
        names = ", ".join(os.path.basename(path) for path in kept)
        raise UserError(f"--last {last}: {run.root} keeps {len(kept)} checkpoints ({names}); train with "
                        f"train.keep_checkpoints={last} (and train.checkpoint_every for their spacing)")
    return kept[-last:]


def mean_weights(model, paths: list[str]) -> list[np.ndarray]:
    """Each of model's weights averaged over the checkpoints at paths (float ones; the others as
    the last path holds them). Sums in float64: no float32 rounding builds up over K checkpoints."""
    sums = [0.0] * len(model.weights)
    for path in paths:
        restore_model(model, path)
        values = [variable.numpy() for variable in model.weights]
        sums = [total + value.astype(np.float64) if is_float(value) else value for total, value in zip(sums, values)]
    return [(total / len(paths)).astype(value.dtype) if is_float(value) else value
            for total, value in zip(sums, values)]


def is_float(value: np.ndarray) -> bool:
    return np.issubdtype(value.dtype, np.floating)


def copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target)
    elif source.is_file():
        shutil.copy2(source, target)
