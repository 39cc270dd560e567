"""The Trainer's step on real packed People's Daily windows: XLA, accumulation, precision."""

import json
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import ModelConfig, TrainConfig
from trainformer.data.pipeline import eval_batches, pack, tokenize_documents, train_dataset
from trainformer.model.heads import build_masked_lm
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
    optimizer = make_optimizer(config.learning_rate, 0, config.steps, config.weight_decay)
    trainer = Trainer(model, optimizer, strategy, config)
    data = train_dataset(windows, config.batch_size, config.seed, 0.15, tokenizer.vocab_size)
    return trainer, iter(data)


def losses(trainer, iterator, steps):
    return np.array([float(r["loss_sum"] / r["count"]) for r in (trainer.train_step(iterator) for _ in range(steps))])


def test_xla_step_matches_the_plain_step(windows, tokenizer):
    plain = losses(*make_trainer(windows, tokenizer, xla="off"), steps=6)
    compiled = losses(*make_trainer(windows, tokenizer, xla="on"), steps=6)
    assert plain[-1] < plain[0]  # it trains
    np.testing.assert_allclose(compiled, plain, rtol=2e-3)


def test_xla_on_really_compiles(windows, tokenizer):
    trainer, iterator = make_trainer(windows, tokenizer, xla="on")
    inputs, targets = next(iterator)
    hlo = trainer._compiled_gradients.experimental_get_compiler_ir(inputs, targets)(stage="hlo")
    assert "HloModule" in hlo


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


@pytest.mark.parametrize("precision, dtype", [("bf16", "mixed_bfloat16"), ("fp16", "mixed_float16")])
def test_mixed_precision_stays_finite_and_close_to_fp32(windows, tokenizer, precision, dtype):
    reference = losses(*make_trainer(windows, tokenizer), steps=15)
    mixed_trainer, iterator = make_trainer(windows, tokenizer, dtype=dtype, precision=precision)
    mixed = losses(mixed_trainer, iterator, steps=15)
    assert np.all(np.isfinite(mixed))
    np.testing.assert_allclose(mixed, reference, rtol=0.03)
    assert mixed[-1] < mixed[0] - 0.3  # and it trains
    if precision == "fp16":  # the scale starts high and halves on overflow: a few skipped steps
        assert 0 <= int(mixed_trainer.loss_scale.skipped_steps) < 5


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


def poisoned(windows, tokenizer, bad_batch: int) -> tf.data.Dataset:
    """The training stream with NaN loss weights in batch number bad_batch."""
    clean = train_dataset(windows, BATCH, 42, 0.15, tokenizer.vocab_size)
    return clean.enumerate().map(
        lambda index, batch: (batch[0], {**batch[1], "masked_weights": batch[1]["masked_weights"]
                                          * tf.where(index == bad_batch, np.nan, 1.0)}))


def fit(trainer, stream: tf.data.Dataset, tmp_path, valid: list):
    tmp_path.mkdir(exist_ok=True)
    checkpoints = Checkpoints(tmp_path / "checkpoints", 5, **trainer.checkpoint_objects())
    monitor = Monitor(tmp_path / "metrics.jsonl", tmp_path / "logs", 100, 1, out=open(tmp_path / "log", "w"))
    trainer.fit(lambda number: iter(stream.skip(number)), valid, 0, monitor, checkpoints)
    return checkpoints


def test_nan_batch_stops_training_before_it_reaches_the_weights(windows, tokenizer, tmp_path):
    trainer, _ = make_trainer(windows, tokenizer, checkpoint_every=2, log_every=1, eval_every=100)
    with pytest.raises(NonFiniteGradients, match=r"step 5: non-finite gradient for \S+") as info:
        fit(trainer, poisoned(windows, tokenizer, bad_batch=4), tmp_path, [])
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
    fit(trainer, poisoned(windows, tokenizer, bad_batch=5), tmp_path / "rollback", valid)

    reference, _ = make_trainer(windows, tokenizer, **config)
    clean = train_dataset(windows, BATCH, 42, 0.15, tokenizer.vocab_size)
    fit(reference, clean.take(4).concatenate(clean.skip(6)), tmp_path / "reference", valid)

    assert int(trainer.step) == 8 and int(trainer.data_offset) == 2 and int(trainer.optimizer.iterations) == 8
    for rolled_back, expected in zip(trainer.model.trainable_variables, reference.model.trainable_variables):
        assert np.array_equal(rolled_back.numpy(), expected.numpy()), rolled_back.path
    events = [json.loads(line) for line in (tmp_path / "rollback" / "metrics.jsonl").read_text().splitlines()]
    rollback = next(e for e in events if e.get("event") == "rollback")
    assert (rollback["step"], rollback["to_step"], rollback["next_batch"]) == (6, 4, 6)


def test_train_step_measures_the_wait_for_input(windows, tokenizer):
    trainer, iterator = make_trainer(windows, tokenizer)
    trainer.train_step(iterator)  # compile first

    def slow(batches):
        for batch in batches:
            time.sleep(0.2)
            yield batch

    assert trainer.train_step(iterator)["data_wait_s"] < 0.1  # prefetched: no wait
    assert trainer.train_step(slow(iterator))["data_wait_s"] >= 0.2
