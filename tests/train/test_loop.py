"""The Trainer's step on real packed People's Daily windows: XLA, accumulation, precision (fp16
unscaling), dense gradients, non-finite steps (stop, rollback and its limit)."""

import json
import os
import signal
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import ModelConfig, TrainConfig
from trainformer.data.pipeline import eval_batches, pack, tokenize_documents, train_dataset
from trainformer.model.heads import build_classifier, build_masked_lm
from trainformer.tasks.classify import classify_sums
from trainformer.tasks.mlm import masked_lm_sums
from trainformer.tokens import PAD_ID
from trainformer.train.checkpoint import Checkpoints
from trainformer.train.loop import NonFiniteGradients, Trainer
from trainformer.train.monitor import Monitor
from trainformer.train.optim import make_optimizer

SEQ, BATCH = 32, 8
MODEL = ModelConfig(d_model=32, num_layers=1, num_heads=2, dff=64, dropout=0.0, norm="pre")


@pytest.fixture(scope="module")
def windows(corpus, tokenizer):
    return pack(tokenize_documents(tokenizer, corpus.train[:400]), SEQ)


def make_trainer(windows, tokenizer, dtype=None, **train):
    train = {"batch_size": BATCH, "steps": 100, **train}
    config = TrainConfig(learning_rate=3e-3, warmup_steps=0, **train)
    keras.utils.set_random_seed(7)
    strategy = tf.distribute.get_strategy()
    model = build_masked_lm(MODEL, tokenizer.vocab_size, SEQ, dtype=dtype)
    optimizer = make_optimizer(config.learning_rate, 0, config.steps, config.weight_decay, ema=config.ema)
    trainer = Trainer(model, optimizer, strategy, config, masked_lm_sums, "masked_accuracy")
    data = train_dataset(windows, config.batch_size, config.seed, 0.15, tokenizer.vocab_size)
    return trainer, iter(data)


def losses(trainer, iterator, steps):
    return np.array([float(r["loss_sum"] / r["count"]) for r in (trainer.train_step(iterator) for _ in range(steps))])


def test_xla_step_matches_the_plain_step(windows, tokenizer):
    plain = losses(*make_trainer(windows, tokenizer, xla="off"), steps=6)
    auto, iterator = make_trainer(windows, tokenizer, xla="auto")  # on CPU: the update alone compiles
    update_compiled = losses(auto, iterator, steps=6)
    on, iterator = make_trainer(windows, tokenizer, xla="on")
    compiled = losses(on, iterator, steps=6)
    assert plain[-1] < plain[0]  # it trains
    gradients = [tf.zeros_like(v) for v in auto.model.trainable_variables]
    assert "HloModule" in auto._apply.experimental_get_compiler_ir(gradients)(stage="hlo")  # raises if not XLA's
    assert "HloModule" in on._compiled_gradients.experimental_get_compiler_ir(*next(iterator))(stage="hlo")
    np.testing.assert_allclose(update_compiled, plain, rtol=1e-4)
    np.testing.assert_allclose(compiled, plain, rtol=2e-3)


@pytest.mark.parametrize("xla", ["off", "on"])
def test_accumulation_equals_one_large_batch(windows, tokenizer, xla):
    """k micro-batches of b give the update of one batch of k*b (embeddings with repeated ids
    included): weights after three updates agree to float32 summation-order noise."""
    k, b = 4, BATCH
    big_batches = list(train_dataset(windows, k * b, 3, 0.15, tokenizer.vocab_size).take(3))
    stacked = tuple({key: tf.stack([batch[part][key] for batch in big_batches]) for key in big_batches[0][part]}
                    for part in (0, 1))  # each value (3, k*b, ...)
    split = tuple({key: tf.reshape(value, [3 * k, b, *value.shape[2:]]) for key, value in part.items()}
                  for part in stacked)  # each value (3*k, b, ...): micro-batches in order
    big, _ = make_trainer(windows, tokenizer, batch_size=k * b, xla=xla)
    small, _ = make_trainer(windows, tokenizer, batch_size=b, accumulate=k, xla=xla)
    big_iterator = iter(tf.data.Dataset.from_tensor_slices(stacked))
    micro_iterator = iter(tf.data.Dataset.from_tensor_slices(split))
    for _ in range(3):
        big.train_step(big_iterator)
        small.train_step(micro_iterator)
    embedding = big.model.encoder.token_embedding.embeddings
    assert not np.allclose(embedding.numpy(), make_trainer(windows, tokenizer)[0].model.encoder.token_embedding.embeddings.numpy())
    for mine, theirs in zip(small.model.trainable_variables, big.model.trainable_variables):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-6, err_msg=mine.path)


@pytest.fixture(scope="module")
def fp32_losses(windows, tokenizer):
    """The losses of 15 fp32 steps, which each mixed precision is compared with."""
    return losses(*make_trainer(windows, tokenizer), steps=15)


@pytest.mark.parametrize("precision, dtype", [("bf16", "mixed_bfloat16"), ("fp16", "mixed_float16")])
def test_mixed_precision_stays_finite_and_close_to_fp32(windows, tokenizer, fp32_losses, precision, dtype):
    mixed_trainer, iterator = make_trainer(windows, tokenizer, dtype=dtype, precision=precision)
    mixed = losses(mixed_trainer, iterator, steps=15)
    assert np.all(np.isfinite(mixed))
    np.testing.assert_allclose(mixed, fp32_losses, rtol=0.03)
    assert mixed[-1] < mixed[0] - 0.3  # and it trains
    if precision == "fp16":  # the scale starts high and halves on overflow: a few skipped steps
        # at 2**15, 2**14 and 2**13 the first step's scaled gradients overflow float16 (the
        # vocabulary projection's among them: its matmul runs in float16), at 2**12 they fit
        assert int(mixed_trainer.loss_scale.skipped_steps) == 3
        assert float(mixed_trainer.loss_scale.scale) == 2.0**12


def test_fp16_overflow_skips_the_update_and_halves_the_scale(windows, tokenizer):
    trainer, iterator = make_trainer(windows, tokenizer, dtype="mixed_float16", precision="fp16")
    before = [v.numpy() for v in trainer.model.trainable_variables]
    trainer.loss_scale.scale.assign(3e38)  # scaled loss overflows to inf
    trainer.train_step(iterator)
    assert int(trainer.loss_scale.skipped_steps) == 1
    assert float(trainer.loss_scale.scale) == pytest.approx(1.5e38)
    for old, variable in zip(before, trainer.model.trainable_variables):
        assert np.array_equal(old, variable.numpy()), variable.path
    assert int(trainer.optimizer.iterations) == 0  # the optimizer never saw the step


def one_logged_step(trainer, windows, tokenizer, tmp_path) -> tuple[dict, list]:
    """Train one step through fit() on the first batch: (its metrics.jsonl line, weight deltas)."""
    before = [v.numpy() for v in trainer.model.trainable_variables]
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    fit(trainer, train_dataset(windows, BATCH, 42, 0.15, tokenizer.vocab_size), tmp_path, valid)
    logged = [e for e in read_events(tmp_path) if e.get("split") == "train"]
    assert len(logged) == 1
    return logged[0], [v.numpy() - old for v, old in zip(trainer.model.trainable_variables, before)]


def test_fp16_step_computes_the_fp32_update(windows, tokenizer, tmp_path):
    """fp16 multiplies the loss by the scale and must divide the gradients back: the same
    batch from the same weights gives fp32's gradient norm and weight update."""
    config = {"steps": 1, "log_every": 1, "eval_every": 1}
    fp32, _ = make_trainer(windows, tokenizer, **config)
    fp16, _ = make_trainer(windows, tokenizer, dtype="mixed_float16", precision="fp16", **config)
    for a, b in zip(fp32.model.trainable_variables, fp16.model.trainable_variables):
        assert np.array_equal(a.numpy(), b.numpy()), a.path  # the same initial weights
    # At the default 2**15 this summed-token loss overflows float16 in the backward pass (a
    # skipped step); 2**10 does not, and unscaled gradients would still be 1024x too large.
    fp16.loss_scale.scale.assign(2.0**10)
    reference, reference_delta = one_logged_step(fp32, windows, tokenizer, tmp_path / "fp32")
    mixed, mixed_delta = one_logged_step(fp16, windows, tokenizer, tmp_path / "fp16")
    assert mixed["skipped_steps"] == 0 and mixed["loss_scale"] == 2.0**10
    assert 0.1 < reference["grad_norm"] < 100
    # The norm is what shows unscaled gradients: clipping and Adam hide their scale from the update.
    assert mixed["grad_norm"] == pytest.approx(reference["grad_norm"], rel=0.02)
    assert mixed["loss"] == pytest.approx(reference["loss"], rel=1e-3)
    for a, b, variable in zip(mixed_delta, reference_delta, fp32.model.trainable_variables):
        assert np.linalg.norm(b) > 0, variable.path  # every variable moved
        assert np.linalg.norm(a - b) <= 0.05 * np.linalg.norm(b), variable.path


def classifier_trainer(tokenizer) -> Trainer:
    keras.utils.set_random_seed(7)
    model = build_classifier(MODEL, tokenizer.vocab_size, SEQ, num_labels=3)
    config = TrainConfig(batch_size=BATCH, steps=10, learning_rate=3e-3, warmup_steps=0)
    optimizer = make_optimizer(config.learning_rate, 0, config.steps, config.weight_decay)
    return Trainer(model, optimizer, tf.distribute.get_strategy(), config, classify_sums, "accuracy")


@pytest.mark.parametrize("model", ["masked_lm", "masked_lm_fp16", "classifier"])
def test_the_step_gets_dense_gradients_for_every_real_model(windows, tokenizer, model):
    """AdamW on IndexedSlices with repeated ids drifts from the dense math (test_optim.py).
    The masked LM's embedding gradient is dense already (its head is tied to the embedding:
    output projection + lookup); the classifier's is not (lookup only), so the Trainer
    densifies: every gradient it all-reduces is a dense tensor."""
    if model == "classifier":
        trainer = classifier_trainer(tokenizer)
        ids = tf.constant(windows[:BATCH])  # (batch, seq), repeated ids in every row
        batch = ({"token_ids": ids, "padding_mask": ids != PAD_ID}, {"labels": tf.range(BATCH, dtype=tf.int32) % 3})
        with tf.GradientTape() as tape:
            loss = classify_sums(trainer.model(batch[0], training=True), batch[1])["loss_sum"]
        raw = dict(zip((v.path for v in trainer.model.trainable_variables),
                       tape.gradient(loss, trainer.model.trainable_variables)))
        assert isinstance(raw["token_embedding/embeddings"], tf.IndexedSlices)  # what the step must convert
    else:
        precision = {"masked_lm": {}, "masked_lm_fp16": {"dtype": "mixed_float16", "precision": "fp16"}}[model]
        trainer, iterator = make_trainer(windows, tokenizer, **precision)
        batch = next(iterator)
    gradients, _ = trainer._compiled_gradients(*batch)  # what the step all-reduces
    for gradient, variable in zip(gradients, trainer.model.trainable_variables):
        assert not isinstance(gradient, tf.IndexedSlices), variable.path
        assert isinstance(gradient, tf.Tensor) and gradient.shape == variable.shape, variable.path


def poisoned(windows, tokenizer, *bad_batches: int) -> tf.data.Dataset:
    """The training stream with NaN loss weights in the batches numbered bad_batches."""
    clean = train_dataset(windows, BATCH, 42, 0.15, tokenizer.vocab_size)
    bad = tf.constant(bad_batches, tf.int64)
    return clean.enumerate().map(
        lambda index, batch: (batch[0], {**batch[1], "masked_weights": batch[1]["masked_weights"]
                                          * tf.where(tf.reduce_any(index == bad), np.nan, 1.0)}))


def valid_loss(model, valid: list):
    """evaluate() for fit: the masked-token loss on fixed batches."""
    def evaluate() -> dict:
        sums = [masked_lm_sums(model(inputs, training=False), targets) for inputs, targets in valid]
        return {"loss": float(sum(s["loss_sum"] for s in sums) / sum(s["count"] for s in sums))}

    return evaluate


def fit(trainer, stream: tf.data.Dataset, tmp_path, valid: list, batches_from=None):
    """Train (or, where tmp_path holds checkpoints, resume as session.py does) to the end."""
    tmp_path.mkdir(exist_ok=True)
    checkpoints = Checkpoints(tmp_path / "checkpoints", 5, **trainer.checkpoint_objects())
    checkpoints.restore_latest()
    monitor = Monitor(tmp_path / "metrics.jsonl", tmp_path / "logs", 100, 1, out=open(tmp_path / "log", "a"),
                      start_step=int(trainer.step.numpy()))
    trainer.fit(batches_from or (lambda number: iter(stream.skip(number))), valid_loss(trainer.model, valid),
                monitor, checkpoints)
    return checkpoints


def acting_at(stream: tf.data.Dataset, batch: int, action):
    """batches_from for fit that calls action() as batch number `batch` is fetched: a signal or a
    crash at a known step, from Python, whatever the machine's speed."""
    def batches_from(number: int):
        for index, element in enumerate(stream.skip(number), start=number):
            if index == batch:
                action()
            yield element

    return batches_from


def test_nan_batch_stops_training_before_it_reaches_the_weights(windows, tokenizer, tmp_path):
    trainer, _ = make_trainer(windows, tokenizer, checkpoint_every=2, log_every=1, eval_every=100)
    with pytest.raises(NonFiniteGradients, match=r"step 5: non-finite gradient for \S+") as info:
        fit(trainer, poisoned(windows, tokenizer, 4), tmp_path, [])
    assert info.value.step == 5 and "checkpoints/ckpt-4" in str(info.value)
    assert all(np.all(np.isfinite(v.numpy())) for v in trainer.model.trainable_variables)
    assert int(trainer.optimizer.iterations) == 4
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-4")


def test_nan_batch_rolls_back_to_the_checkpoint_and_skips_the_batches_since(windows, tokenizer, tmp_path):
    """NaN in batch 5 (step 6): back to ckpt-4, skip batches 4 and 5. The result is bitwise the
    run that never saw them."""
    config = {"steps": 8, "checkpoint_every": 4, "log_every": 1, "eval_every": 100}
    trainer, _ = make_trainer(windows, tokenizer, on_nan="rollback", **config)
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    fit(trainer, poisoned(windows, tokenizer, 5), tmp_path / "rollback", valid)

    reference, _ = make_trainer(windows, tokenizer, **config)
    clean = train_dataset(windows, BATCH, 42, 0.15, tokenizer.vocab_size)
    fit(reference, clean.take(4).concatenate(clean.skip(6)), tmp_path / "reference", valid)

    assert int(trainer.step) == 8 and int(trainer.data_offset) == 2 and int(trainer.optimizer.iterations) == 8
    for rolled_back, expected in zip(trainer.model.trainable_variables, reference.model.trainable_variables):
        assert np.array_equal(rolled_back.numpy(), expected.numpy()), rolled_back.path
    events = [json.loads(line) for line in (tmp_path / "rollback" / "metrics.jsonl").read_text().splitlines()]
    rollback = next(e for e in events if e.get("event") == "rollback")
    assert (rollback["step"], rollback["to_step"], rollback["next_batch"]) == (6, 4, 6)


def read_events(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


# Two micro-batches per step; NaN in batch 11, i.e. in step 6 (batches 10 and 11). Back to ckpt-4
# (batches 0-7), so batches 8-11 are skipped (step 5's good ones too) and step 5 trains 12-13.
ACCUMULATED = {"steps": 8, "accumulate": 2, "checkpoint_every": 4, "log_every": 1, "eval_every": 100}


def weights(trainer) -> list[np.ndarray]:
    return [v.numpy() for v in trainer.model.trainable_variables]


def test_ema_evaluates_the_average_and_trains_on_the_weights(windows, tokenizer):
    """train.ema: inside averaged_weights the model holds the moving average (a copy of the
    weights after the first step, then avg = m * avg + (1 - m) * w), after it its trained
    weights exactly: a run that looked at the average trains bitwise what one that never did."""
    looked, iterator = make_trainer(windows, tokenizer, ema=0.9)
    average = None
    for _ in range(3):
        looked.train_step(iterator)
        now = weights(looked)
        average = now if average is None else [0.9 * a + 0.1 * w for a, w in zip(average, now)]
    with looked.averaged_weights():
        for ours, expected in zip(weights(looked), average):
            np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-7)
        assert not all(np.array_equal(a, w) for a, w in zip(weights(looked), now))
    for ours, trained in zip(weights(looked), now):
        assert np.array_equal(ours, trained)
    losses(looked, iterator, 2)
    never, other = make_trainer(windows, tokenizer, ema=0.9)
    losses(never, other, 5)
    for ours, expected in zip(weights(looked), weights(never)):
        assert np.array_equal(ours, expected)


@pytest.fixture(scope="module")
def rolled_back(windows, tokenizer, tmp_path_factory):
    """The uninterrupted run of ACCUMULATED through its rollback: (trainer, its folder)."""
    folder = tmp_path_factory.mktemp("rolled-back")
    trainer, _ = make_trainer(windows, tokenizer, on_nan="rollback", **ACCUMULATED)
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    fit(trainer, poisoned(windows, tokenizer, 11), folder, valid)
    return trainer, folder


def test_a_rollback_with_accumulation_skips_exactly_the_batches_since_the_checkpoint(
        windows, tokenizer, tmp_path, rolled_back):
    """Bitwise the run that trained batches 0-7 then 12-19: nothing skipped twice, nothing replayed."""
    trainer, folder = rolled_back
    reference, _ = make_trainer(windows, tokenizer, **ACCUMULATED)
    clean = train_dataset(windows, BATCH, 42, 0.15, tokenizer.vocab_size)
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    fit(reference, clean.take(8).concatenate(clean.skip(12)), tmp_path, valid)
    assert int(trainer.step) == 8 and int(trainer.data_offset) == 4 and int(trainer.optimizer.iterations) == 8
    events = read_events(folder)
    rollback = next(e for e in events if e.get("event") == "rollback")
    assert (rollback["step"], rollback["to_step"], rollback["next_batch"]) == (6, 4, 12)
    # Step 5 was logged, then rolled back and trained again: metrics.jsonl keeps it once, and
    # the events that say why.
    assert [e["step"] for e in events if e.get("split") == "train"] == list(range(1, 9))
    assert [e["event"] for e in events if "event" in e] == ["non_finite", "rollback"]
    for ours, expected, variable in zip(weights(trainer), weights(reference), trainer.model.trainable_variables):
        assert np.array_equal(ours, expected), variable.path


def test_a_rolled_back_run_stopped_by_sigterm_resumes_bitwise(windows, tokenizer, tmp_path, rolled_back):
    """SIGTERM as batch 14 is fetched (step 6 again, after the rollback): the step finishes, ckpt-6
    holds the data offset, and a new Trainer resumed from it trains batches 16-19 and ends bitwise
    where the uninterrupted rolled-back run did."""
    stream = poisoned(windows, tokenizer, 11)
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    stopped, _ = make_trainer(windows, tokenizer, on_nan="rollback", **ACCUMULATED)
    fit(stopped, stream, tmp_path, valid, acting_at(stream, 14, lambda: os.kill(os.getpid(), signal.SIGTERM)))
    assert stopped.stopped_by == "SIGTERM" and int(stopped.step) == 6
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-6")
    assert read_events(tmp_path)[-1] == {"event": "stopped", "signal": "SIGTERM", "step": 6}

    keras.utils.set_random_seed(99)  # the resumed run's weights come from the checkpoint, not from its init
    resumed, _ = make_trainer(windows, tokenizer, on_nan="rollback", **ACCUMULATED)
    fit(resumed, stream, tmp_path, valid)
    assert (int(resumed.step), int(resumed.data_offset)) == (8, 4)
    for ours, expected, variable in zip(weights(resumed), weights(rolled_back[0]), resumed.model.trainable_variables):
        assert np.array_equal(ours, expected), variable.path


class Crash(Exception):
    """Stands in for kill -9 between a logged step and the next checkpoint."""


def crash() -> None:
    raise Crash()


def test_a_rerun_after_a_crash_drops_the_records_past_its_checkpoint(windows, tokenizer, tmp_path):
    """Crash as step 7 fetches its batch: metrics.jsonl holds steps 5 and 6 (and the eval at 6),
    the latest checkpoint is ckpt-4. The rerun drops exactly those records and writes them again:
    every step once, in order, the records up to step 4 untouched."""
    config = {"steps": 8, "checkpoint_every": 4, "log_every": 1, "eval_every": 3}
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    stream = train_dataset(windows, BATCH, 42, 0.15, tokenizer.vocab_size)
    with pytest.raises(Crash):
        fit(make_trainer(windows, tokenizer, **config)[0], stream, tmp_path, valid, acting_at(stream, 6, crash))
    before = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert [(e["split"], e["step"]) for e in map(json.loads, before)][-3:] == [("train", 5), ("train", 6),
                                                                             ("valid", 6)]
    kept = [line for line in before if json.loads(line)["step"] <= 4]
    assert len(kept) == 5  # train 1-4 and valid 3

    fit(make_trainer(windows, tokenizer, **config)[0], stream, tmp_path, valid)
    after = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert after[:len(kept)] == kept and not set(before[len(kept):]) & set(after)
    assert [(e["split"], e["step"]) for e in map(json.loads, after)] == [
        ("train", 1), ("train", 2), ("train", 3), ("valid", 3), ("train", 4), ("train", 5), ("train", 6),
        ("valid", 6), ("train", 7), ("train", 8), ("valid", 8)]


def test_a_fourth_rollback_to_one_checkpoint_stops_the_run(windows, tokenizer, tmp_path):
    """Batches 4-7 are all NaN: three rollbacks to ckpt-4 each skip one more, the fourth
    non-finite step stops the run."""
    config = {"steps": 12, "checkpoint_every": 4, "log_every": 1, "eval_every": 100}
    trainer, _ = make_trainer(windows, tokenizer, on_nan="rollback", **config)
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    with pytest.raises(NonFiniteGradients, match="again after 3 rollbacks to the same checkpoint") as info:
        fit(trainer, poisoned(windows, tokenizer, 4, 5, 6, 7), tmp_path, valid)
    assert info.value.step == 5 and "checkpoints/ckpt-4" in str(info.value)
    events = read_events(tmp_path)
    rollbacks = [(e["step"], e["to_step"], e["next_batch"]) for e in events if e.get("event") == "rollback"]
    assert rollbacks == [(5, 4, 5), (5, 4, 6), (5, 4, 7)]
    assert sum(e.get("event") == "non_finite" for e in events) == 4
    assert int(trainer.optimizer.iterations) == 4
    assert all(np.all(np.isfinite(v.numpy())) for v in trainer.model.trainable_variables)


def test_rollbacks_count_per_checkpoint(windows, tokenizer, tmp_path):
    """Four rollbacks, two to ckpt-4 and two to ckpt-8: the run goes on to the end."""
    config = {"steps": 12, "checkpoint_every": 4, "log_every": 1, "eval_every": 100}
    trainer, _ = make_trainer(windows, tokenizer, on_nan="rollback", **config)
    valid = eval_batches(windows[:BATCH], BATCH, 0, 0.15, tokenizer.vocab_size)
    # ckpt-4 after batches 0-3; 4, 5 bad; steps 5-8 train on 6-9 (ckpt-8); 10, 11 bad.
    fit(trainer, poisoned(windows, tokenizer, 4, 5, 10, 11), tmp_path, valid)
    rollbacks = [(e["step"], e["to_step"]) for e in read_events(tmp_path) if e.get("event") == "rollback"]
    assert rollbacks == [(5, 4), (5, 4), (9, 8), (9, 8)]
    assert int(trainer.step) == 12 and int(trainer.data_offset) == 4


def test_train_step_measures_the_wait_for_input(windows, tokenizer):
    trainer, iterator = make_trainer(windows, tokenizer)
    trainer.train_step(iterator)  # compile first

    def slow(batches):
        for batch in batches:
            time.sleep(0.2)
            yield batch

    assert trainer.train_step(iterator)["data_wait_s"] < 0.1  # prefetched: no wait
    assert trainer.train_step(slow(iterator))["data_wait_s"] >= 0.2
