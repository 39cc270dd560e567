"""Checkpoints: model, optimizer, step and dropout RNG state; latest and best.

The data stream needs no state of its own: batch n is a function of the step (pipeline.py).

tf.train.CheckpointManager writes the data files first and then swaps the small `checkpoint`
state file in with an atomic rename, so a crash mid-save leaves the previous checkpoint as
the latest one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import keras
import tensorflow as tf

from trainformer.errors import UserError
from trainformer.files import write_atomic
from trainformer.run_dir import no_checkpoint_yet

BEST_FILE = "best.json"  # in the checkpoints folder: which eval best/ holds, and its metrics


def dropout_seed_states(model: keras.Model) -> list[tf.Variable]:
    """Keras 3 dropout SeedGenerator states, which tf.train.Checkpoint does not track through
    the model (DESIGN.md): without them dropout masks differ after a resume."""
    return [v for v in model.non_trainable_variables if v.path.endswith("seed_generator_state")]


def weights_digest(model: keras.Model) -> str:
    """SHA-256 of every weight's bytes: equal digests mean bitwise-equal models."""
    digest = hashlib.sha256()
    for variable in model.weights:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()


class Checkpoints:
    """The checkpoints of one run: the last `keep` by step, plus the best by one valid metric:
    `best_metric` (default the loss, lower is better; an accuracy with higher_is_better).

    The best one's record, best.json ({"step", "metric", "value", "valid_loss", "path"}), is
    rewritten atomically after its checkpoint is saved, and read from disk at each eval, so a
    resumed run goes on beating the best of the run so far, not of its own segment.
    """

    def __init__(self, folder: Path, keep: int, best_metric: str = "loss", higher_is_better: bool = False,
                 **trackables):
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.latest = tf.train.CheckpointManager(self.checkpoint, str(folder), max_to_keep=keep, checkpoint_name="ckpt")
        self.best = tf.train.CheckpointManager(self.checkpoint, str(folder / "best"), max_to_keep=1, checkpoint_name="best")
        self.best_file = folder / BEST_FILE
        self.best_metric = best_metric
        self.higher_is_better = higher_is_better

    def restore_latest(self, warn=print) -> str | None:
        """Restore the newest checkpoint that loads; returns its path (None: no checkpoints).

        A checkpoint whose files were truncated or damaged (a disk filled up, a copy was cut
        short) is skipped with a warning and the one before it is used. If checkpoints exist
        but none loads, the run stops instead of starting over, which would rotate them away.
        """
        paths = list(reversed(kept_checkpoints(self.latest.directory)))
        for path in paths:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
                return path
            except (tf.errors.OpError, ValueError, AssertionError, IndexError) as err:
                reason = (str(err).strip().splitlines() or [""])[0][:200]
                warn(f"warning: checkpoint {path} cannot be loaded ({type(err).__name__}: {reason}); "
                     f"trying the previous one")
        if paths:
            raise UserError(f"{self.latest.directory}: none of {len(paths)} checkpoints can be loaded; "
                            f"move them away to start over")
        return None

    def save(self, step: int) -> str:
        return self.latest.save(checkpoint_number=step)

    def best_value(self) -> float | None:
        """The best valid `best_metric` so far (None: no eval was saved as the best yet, or the
        record was kept by another metric)."""
        record = read_best_record(self.best_file.parent)
        return record["value"] if record and record["metric"] == self.best_metric else None

    def save_if_best(self, step: int, metrics: dict) -> bool:
        """Save a checkpoint into best/ if this eval's metrics beat the best so far; whether it did.

        Should the process die between the checkpoint and its record, best/ holds a checkpoint
        better than the record says: the next eval compares against the record (the older,
        lower bar), so best/ never holds one worse than the record, nor a half-written one."""
        value, best = float(metrics[self.best_metric]), self.best_value()
        if best is not None and not (value > best if self.higher_is_better else value < best):
            return False
        path = self.best.save(checkpoint_number=step)
        record = {"step": step, "metric": self.best_metric, "value": value, "valid_loss": float(metrics["loss"]),
                  "path": path}
        write_atomic(self.best_file, json.dumps(record) + "\n")
        return True


def read_best_record(folder: Path) -> dict | None:
    """best.json of a run's checkpoints folder, or None. A record of a run from before
    train.keep_best (no "metric") was by the valid loss."""
    path = folder / BEST_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    if "metric" not in record:
        record.update(metric="loss", value=record["valid_loss"])
    return record


def kept_checkpoints(folder) -> list[str]:
    """The paths of a run's latest checkpoints, oldest first, as its state file lists them. Not
    CheckpointManager.checkpoints: a state file without timestamps
    (tf.compat.v1.train.update_checkpoint_state writes none, e.g. in a script that copies a run)
    leaves the manager's list empty, and a resume would start over."""
    state = tf.train.get_checkpoint_state(str(folder))
    return list(state.all_model_checkpoint_paths) if state else []


def checkpoint_step(path: str) -> int:
    """The step a checkpoint was saved at, from its name (ckpt-N, best-N)."""
    return int(path.rsplit("-", 1)[1])


def describe_best(folder: Path, path: str) -> str:
    """"best (step N, valid accuracy 0.8123)" for the checkpoint at path in folder/best (the
    value only when best.json describes that very checkpoint)."""
    step, record = checkpoint_step(path), read_best_record(folder)
    if record is None or record["step"] != step:
        return f"best (step {step})"
    return f"best (step {step}, valid {record['metric'].replace('_', ' ')} {record['value']:.4f})"


def find_checkpoint(folder: Path, which: str = "latest") -> str:
    """The path of a run's latest or best checkpoint; a UserError that says why there is none."""
    path = tf.train.latest_checkpoint(str(folder / "best" if which == "best" else folder))
    if path is not None:
        return path
    if which == "best" and tf.train.latest_checkpoint(str(folder)):
        raise UserError(f"{folder}: no best checkpoint yet (one is saved at each eval that beats the best valid "
                        f"loss, or accuracy with train.keep_best); use --checkpoint latest")
    raise no_checkpoint_yet(folder.parent)


def choose_checkpoint(folder: Path, which: str | None, keep_best: bool) -> tuple[str, str | None]:
    """(path, what to tell the user about it or None) of the checkpoint eval, predict and export
    load. which: "latest", "best", or None: best/ when the run kept its best by valid accuracy
    (train.keep_best) and has one, else the latest. Choosing the latest is said only where the
    run has a best checkpoint the user might have expected."""
    if which is None:
        has_best = tf.train.latest_checkpoint(str(folder / "best")) is not None
        which = "best" if keep_best and has_best else "latest"
        if keep_best and not has_best:
            path = find_checkpoint(folder, "latest")
            return path, f"latest (step {checkpoint_step(path)}): no eval has been kept as the best yet"
    path = find_checkpoint(folder, which)
    return path, describe_best(folder, path) if which == "best" else None


def restore_model(model: keras.Model, path: str) -> int:
    """Load only the model weights of a checkpoint; returns its step."""
    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, step=step).restore(path).expect_partial()
    return int(step.numpy())


def restore_chosen(model: keras.Model, path: str, folder: Path, which: str | None, keep_best: bool) -> tuple[str, int]:
    """restore_model from path, choose_checkpoint's choice, as (path, step). A run still training
    deletes its older checkpoints (train.keep_checkpoints), maybe between that choice and this
    read: then the checkpoint chosen now is read."""
    try:
        return path, restore_model(model, path)
    except tf.errors.NotFoundError:
        path, _ = choose_checkpoint(folder, which, keep_best)
        return path, restore_model(model, path)


def restore_pretrained(model: keras.Model, folder: Path) -> str:
    """Start model's encoder from the latest checkpoint in folder (a pretraining run, or a
    BERT imported with `trainformer import hf`, whose pooler also starts a classifier's head);
    the rest of the head stays freshly initialised. Returns the checkpoint's path."""
    path = tf.train.latest_checkpoint(str(folder))
    if path is None:
        raise UserError(f"model.init_from: {folder.parent}: no checkpoint to start from")
    parts = {"model": tf.train.Checkpoint(encoder=model.encoder)}
    saved = {name for name, _ in tf.train.list_variables(path)}
    pooler = getattr(getattr(model, "head", None), "pooler", None)
    if pooler is not None and any(name.startswith("pooler/") for name in saved):
        parts["pooler"] = pooler  # an imported BERT's pooler: the classifier head's first layer
    source = tf.train.Checkpoint(**parts)
    try:
        # the optimizer and the MLM head are left behind on purpose: expect_partial keeps TF from
        # listing each of them as "unrestored" when the checkpoint object is deleted
        source.restore(path).assert_existing_objects_matched().expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise UserError(f"model.init_from: {path}: its encoder does not fit this model ({reason})") from None
    return path
