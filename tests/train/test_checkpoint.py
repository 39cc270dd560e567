"""The best checkpoint: by the valid loss, or by the task's valid accuracy (train.keep_best);
its record across a resume; and which checkpoint eval, predict and export load."""

import json

import pytest
import tensorflow as tf

from trainformer.errors import UserError
from trainformer.train.checkpoint import Checkpoints, choose_checkpoint, read_best_record, restore_chosen


def by_accuracy(folder, step):
    """A run's Checkpoints as train.keep_best makes them (a new object: a new process)."""
    return Checkpoints(folder, 2, best_metric="accuracy", higher_is_better=True, step=step)


def test_keep_best_keeps_the_highest_valid_accuracy_across_a_resume(tmp_path):
    step = tf.Variable(0, dtype=tf.int64)
    folder = tmp_path / "checkpoints"
    checkpoints = by_accuracy(folder, step)
    assert checkpoints.save_if_best(10, {"accuracy": 0.6, "loss": 1.0})
    assert not checkpoints.save_if_best(20, {"accuracy": 0.6, "loss": 0.5})  # a tie is no better; nor a lower loss
    assert checkpoints.save_if_best(30, {"accuracy": 0.8, "loss": 0.9})
    resumed = by_accuracy(folder, step)  # the run stopped and resumed: the record is on disk
    assert resumed.best_value() == 0.8
    assert not resumed.save_if_best(40, {"accuracy": 0.7, "loss": 0.1})
    record = read_best_record(folder)
    assert record == {"step": 30, "metric": "accuracy", "value": 0.8, "valid_loss": 0.9,
                      "path": str(folder / "best" / "best-30")}
    assert tf.train.latest_checkpoint(str(folder / "best")) == record["path"]  # best/ holds that one only
    assert resumed.save_if_best(50, {"accuracy": 0.9, "loss": 0.2})
    assert [p.name for p in sorted((folder / "best").glob("*.index"))] == ["best-50.index"]


def test_without_keep_best_the_best_is_the_lowest_valid_loss(tmp_path):
    checkpoints = Checkpoints(tmp_path, 2, step=tf.Variable(0, dtype=tf.int64))
    assert checkpoints.save_if_best(10, {"loss": 2.0, "accuracy": 0.9})
    assert not checkpoints.save_if_best(20, {"loss": 2.5, "accuracy": 0.95})
    assert read_best_record(tmp_path)["step"] == 10 and read_best_record(tmp_path)["metric"] == "loss"


def test_a_record_from_before_keep_best_is_by_the_valid_loss(tmp_path):
    (tmp_path / "best.json").write_text(json.dumps({"step": 5, "valid_loss": 3.0, "path": "x/best-5"}))
    assert read_best_record(tmp_path)["metric"] == "loss" and read_best_record(tmp_path)["value"] == 3.0
    # a run now keeping the best by accuracy does not compare its accuracy with that loss
    assert by_accuracy(tmp_path, tf.Variable(0, dtype=tf.int64)).best_value() is None


@pytest.fixture
def saved(tmp_path):
    """Checkpoints at steps 10 and 20; the best, by accuracy, at 10."""
    step = tf.Variable(0, dtype=tf.int64)
    checkpoints = by_accuracy(tmp_path, step)
    for number, accuracy in ((10, 0.75), (20, 0.5)):
        step.assign(number)
        checkpoints.save(number)
        checkpoints.save_if_best(number, {"accuracy": accuracy, "loss": 1.0})
    return tmp_path


def test_a_state_file_without_timestamps_resumes_its_latest_checkpoint(saved):
    """tf.compat.v1.train.update_checkpoint_state (a script that copies a run) writes no
    timestamps; CheckpointManager then lists no checkpoints, and the run would have started over."""
    paths = [str(saved / "ckpt-10"), str(saved / "ckpt-20")]
    tf.compat.v1.train.update_checkpoint_state(str(saved), paths[-1], paths)
    assert "timestamp" not in (saved / "checkpoint").read_text()
    step = tf.Variable(0, dtype=tf.int64)
    assert by_accuracy(saved, step).restore_latest() == str(saved / "ckpt-20") and int(step.numpy()) == 20


def test_a_keep_best_run_loads_its_best_checkpoint_by_default(saved):
    path, said = choose_checkpoint(saved, None, keep_best=True)
    assert path.endswith("best/best-10") and said == "best (step 10, valid accuracy 0.7500)"
    path, said = choose_checkpoint(saved, "latest", keep_best=True)  # asked for: said nothing
    assert path.endswith("ckpt-20") and said is None


def test_other_runs_load_the_latest_by_default(saved):
    assert choose_checkpoint(saved, None, keep_best=False) == (str(saved / "ckpt-20"), None)
    assert choose_checkpoint(saved, "best", keep_best=False)[1] == "best (step 10, valid accuracy 0.7500)"


def test_a_keep_best_run_without_a_best_yet_loads_the_latest_and_says_so(tmp_path):
    checkpoints = by_accuracy(tmp_path, tf.Variable(0, dtype=tf.int64))
    checkpoints.save(5)
    path, said = choose_checkpoint(tmp_path, None, keep_best=True)
    assert path.endswith("ckpt-5") and said.startswith("latest (step 5): no eval")
    with pytest.raises(UserError, match="no best checkpoint yet"):
        choose_checkpoint(tmp_path, "best", keep_best=True)


def test_a_record_that_does_not_describe_the_best_checkpoint_is_not_quoted(saved):
    """A crash between saving best/ and rewriting best.json: the checkpoint's own step is told,
    not the older record's value."""
    record = json.loads((saved / "best.json").read_text())
    (saved / "best.json").write_text(json.dumps({**record, "step": 3}))
    assert choose_checkpoint(saved, None, keep_best=True)[1] == "best (step 10)"


def test_a_checkpoint_deleted_after_it_was_chosen_gives_way_to_the_newer_one(saved):
    """eval on a run still training: the run rotated the chosen checkpoint away (it keeps
    train.keep_checkpoints) before eval read it."""
    chosen = str(saved / "ckpt-10")
    for part in saved.glob("ckpt-10.*"):
        part.unlink()
    assert restore_chosen(tf.Module(), chosen, saved, "latest", keep_best=False) == (str(saved / "ckpt-20"), 20)
