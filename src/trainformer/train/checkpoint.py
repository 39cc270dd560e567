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
    """The checkpoints of one run: the last `keep` by step, plus the best by valid loss."""

    def __init__(self, folder: Path, keep: int, **trackables):
        self.checkpoint = tf.train.Checkpoint(**trackables)
        self.latest = tf.train.CheckpointManager(self.checkpoint, str(folder), max_to_keep=keep, checkpoint_name="ckpt")
        self.best = tf.train.CheckpointManager(self.checkpoint, str(folder / "best"), max_to_keep=1, checkpoint_name="best")
        self.best_file = folder / "best.json"

    def restore_latest(self, warn=print) -> str | None:
        """Restore the newest checkpoint that loads; returns its path (None: no checkpoints).

        A checkpoint whose files were truncated or damaged (a disk filled up, a copy was cut
        short) is skipped with a warning and the one before it is used. If checkpoints exist
        but none loads, the run stops instead of starting over, which would rotate them away.
        """
        paths = list(reversed(self.latest.checkpoints))
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

    def best_loss(self) -> float:
        if not self.best_file.is_file():
            return float("inf")
        return json.loads(self.best_file.read_text())["valid_loss"]

    def save_if_best(self, step: int, valid_loss: float) -> bool:
        if not valid_loss < self.best_loss():
            return False
        path = self.best.save(checkpoint_number=step)
        write_atomic(self.best_file, json.dumps({"step": step, "valid_loss": valid_loss, "path": path}) + "\n")
        return True


def find_checkpoint(folder: Path, which: str = "latest") -> str:
    """The path of a run's latest or best checkpoint; a UserError that says why there is none."""
    path = tf.train.latest_checkpoint(str(folder / "best" if which == "best" else folder))
    if path is not None:
        return path
    if which == "best" and tf.train.latest_checkpoint(str(folder)):
        raise UserError(f"{folder}: no best checkpoint yet (one is saved at each eval that lowers the valid "
                        f"loss); use --checkpoint latest")
    raise UserError(f"{folder.parent}: no checkpoint yet (the first is saved after train.checkpoint_every steps)")


def restore_model(model: keras.Model, path: str) -> int:
    """Load only the model weights of a checkpoint; returns its step."""
    step = tf.Variable(0, dtype=tf.int64)
    tf.train.Checkpoint(model=model, step=step).restore(path).expect_partial()
    return int(step.numpy())


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
