"""The Trainer's step on real packed People's Daily windows: XLA, accumulation, precision."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import ModelConfig, TrainConfig
from trainformer.data.pipeline import pack, tokenize_documents, train_dataset
from trainformer.model.heads import build_masked_lm
from trainformer.train.loop import Trainer
from trainformer.train.optim import make_optimizer

SEQ, BATCH = 32, 8
MODEL = ModelConfig(d_model=32, num_layers=1, num_heads=2, dff=64, dropout=0.0, norm="pre")


@pytest.fixture(scope="module")
def windows(corpus, tokenizer):
    return pack(tokenize_documents(tokenizer, corpus.train[:400]), SEQ)


def make_trainer(windows, tokenizer, dtype=None, **train):
    train = {"batch_size": BATCH, **train}
    config = TrainConfig(steps=100, learning_rate=3e-3, warmup_steps=0, **train)
    keras.utils.set_random_seed(7)
    strategy = tf.distribute.get_strategy()
    model = build_masked_lm(MODEL, tokenizer.vocab_size, SEQ, dtype=dtype)
    optimizer = make_optimizer(config.learning_rate, 0, config.steps, config.weight_decay)
    trainer = Trainer(model, optimizer, strategy, config)
    data = train_dataset(windows, config.batch_size, config.seed, 0.15, tokenizer.vocab_size)
    return trainer, iter(data)


def losses(trainer, iterator, steps):
    return np.array([float(r["loss_sum"] / r["count"]) for r in (trainer._train_step(iterator) for _ in range(steps))])


def test_xla_step_matches_the_plain_step(windows, tokenizer):
    plain = losses(*make_trainer(windows, tokenizer, xla="off"), steps=6)
    compiled = losses(*make_trainer(windows, tokenizer, xla="on"), steps=6)
    assert plain[-1] < plain[0]  # it trains
    np.testing.assert_allclose(compiled, plain, rtol=2e-3)


def test_xla_on_really_compiles(windows, tokenizer):
    trainer, iterator = make_trainer(windows, tokenizer, xla="on")
    inputs, targets = next(iterator)
    hlo = trainer._compiled_step.experimental_get_compiler_ir(inputs, targets)(stage="hlo")
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
        big._train_step(big_iterator)
        small._train_step(micro_iterator)
    embedding = big.model.encoder.token_embedding.embeddings
    assert not np.allclose(embedding.numpy(), make_trainer(windows, tokenizer)[0].model.encoder.token_embedding.embeddings.numpy())
    for mine, theirs in zip(small.model.trainable_variables, big.model.trainable_variables):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-6, err_msg=mine.path)
