"""The learning-rate schedule, AdamW with weight decay on the real models' matrices only, the fp16
dynamic loss scale, the gradient transform that keeps AdamW on the dense math, and layer-wise
learning-rate decay (train.layer_decay)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainformer.config import ModelConfig, load_config
from trainformer.model.heads import build_classifier, build_masked_lm, layer_decay_multipliers
from trainformer.run.session import build_trainer
from trainformer.tasks.mlm import MaskedLMTask
from trainformer.train.optim import (
    DynamicLossScale,
    Triangle,
    WarmupLinearDecay,
    dense_gradients,
    make_optimizer,
    normalized_and_clipped,
)

VOCAB, D = 10, 4
IDS = np.array([1, 3, 1, 1, 7, 3])  # repeated ids: the case that matters
RNG = np.random.default_rng(0)
E0 = RNG.normal(size=(VOCAB, D)).astype("float32")
TARGET = RNG.normal(size=(len(IDS), D)).astype("float32")


# --- schedule -------------------------------------------------------------------------------

def test_warmup_linear_decay_shape():
    # Step k is the k-th update (0-based): every one of the 100 updates gets a non-zero rate.
    schedule = WarmupLinearDecay(peak=1e-3, warmup_steps=10, total_steps=100)
    lr = np.array([float(schedule(step)) for step in range(0, 121)])
    assert lr[0] == pytest.approx(1e-4)  # the first update already moves the weights
    assert lr[9] == pytest.approx(1e-3) and lr.max() == pytest.approx(1e-3)
    assert lr[99] > 0 and lr[100] == 0.0 and np.all(lr[100:] == 0.0)  # never negative after the end
    np.testing.assert_allclose(lr[:10], 1e-3 * np.arange(1, 11) / 10, rtol=1e-5)  # linear up
    np.testing.assert_allclose(lr[10:101], 1e-3 * (100 - np.arange(10, 101)) / 90, rtol=1e-5, atol=1e-9)  # down
    assert lr[55] == pytest.approx(0.5e-3, rel=1e-5)


def test_no_warmup_starts_at_peak():
    schedule = WarmupLinearDecay(peak=1e-3, warmup_steps=0, total_steps=10)
    assert float(schedule(0)) == pytest.approx(1e-3)


def test_triangle_rises_from_a_quarter_to_the_peak_at_three_quarters_then_falls_to_zero():
    schedule = Triangle(peak=1e-3, total_steps=100)
    lr = np.array([float(schedule(step)) for step in range(0, 111)])
    np.testing.assert_allclose(lr[:76], 1e-3 * (0.25 + np.arange(76) / 100), rtol=1e-5)  # up, 0.01 x peak a step
    assert lr.max() == pytest.approx(1e-3) and lr.argmax() == 75
    np.testing.assert_allclose(lr[75:101], 1e-3 * (100 - np.arange(75, 101)) / 25, rtol=1e-5, atol=1e-9)  # down
    assert np.all(lr[100:] == 0.0)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(clone, Triangle) and float(clone(tf.constant(50, tf.int64))) == pytest.approx(float(schedule(50)))


def test_train_schedule_triangle_is_the_optimizer_s_schedule():
    config = load_config(None, ["model.d_model=16", "model.num_layers=1", "model.num_heads=2", "model.dff=32",
                                "data.seq_len=8", "train.steps=8", "train.schedule=triangle",
                                "train.learning_rate=1e-3", "train.precision=fp32"])
    task = MaskedLMTask(config)
    task.vocab_size = 50
    optimizer = build_trainer(config, task, tf.distribute.get_strategy()).optimizer
    seen = []
    for step in (0, 6, 8):
        optimizer.iterations.assign(step)
        seen.append(float(optimizer.learning_rate))
    np.testing.assert_allclose(seen, [2.5e-4, 1e-3, 0.0], rtol=1e-6)  # a quarter, the peak at 6 of 8, zero


def test_schedule_accepts_tensor_steps_and_serializes():
    schedule = WarmupLinearDecay(peak=2e-4, warmup_steps=4, total_steps=8)
    assert float(schedule(tf.constant(2, tf.int64))) == pytest.approx(1.5e-4)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(clone, WarmupLinearDecay) and clone.get_config() == schedule.get_config()


def test_a_warmup_longer_than_the_run_is_capped_at_train_steps():
    """train.warmup_steps=200 on a 10-step run: the optimizer `train` builds climbs over the 10
    steps, reaching the peak on the last one, instead of a 200-step warmup that never gets
    past 5% of it."""
    config = load_config(None, ["model.d_model=16", "model.num_layers=1", "model.num_heads=2", "model.dff=32",
                                "data.seq_len=8", "train.steps=10", "train.warmup_steps=200",
                                "train.learning_rate=1e-3", "train.precision=fp32"])
    task = MaskedLMTask(config)
    task.vocab_size = 50  # what prepare() would read from a vocabulary
    optimizer = build_trainer(config, task, tf.distribute.get_strategy()).optimizer
    seen = []
    for step in range(11):
        optimizer.iterations.assign(step)
        seen.append(float(optimizer.learning_rate))
    np.testing.assert_allclose(seen, [1e-4 * k for k in range(1, 11)] + [0.0], rtol=1e-6)


def test_optimizer_uses_the_schedule():
    optimizer = make_optimizer(peak=0.1, warmup_steps=2, total_steps=4, weight_decay=0.01)
    assert isinstance(optimizer, keras.optimizers.AdamW)
    variable = keras.Variable(np.ones(3, "float32"), name="kernel")
    optimizer.build([variable])
    seen = []
    for _ in range(4):
        seen.append(float(optimizer.learning_rate))
        optimizer.apply([tf.ones(3)], [variable])
    np.testing.assert_allclose(seen, [0.05, 0.1, 0.1, 0.05], rtol=1e-6)


def test_no_weight_decay_on_biases_and_layernorm():
    optimizer = make_optimizer(peak=0.1, warmup_steps=1, total_steps=10, weight_decay=0.5)
    kernel = keras.Variable(np.ones(3, "float32"), name="kernel")
    bias = keras.Variable(np.ones(3, "float32"), name="bias")
    gamma = keras.Variable(np.ones(3, "float32"), name="gamma")
    for _ in range(3):  # zero gradients: only weight decay can move a variable
        optimizer.apply([tf.zeros(3)] * 3, [kernel, bias, gamma])
    assert np.all(np.asarray(kernel) < 1.0)
    np.testing.assert_array_equal(np.asarray(bias), 1.0)
    np.testing.assert_array_equal(np.asarray(gamma), 1.0)


MODEL = ModelConfig(d_model=16, num_layers=1, num_heads=2, dff=32, dropout=0.0, norm="post", position="learned")
ENCODER_KINDS = ["token_embedding/embeddings", "position_embedding/positions", "qkv/kernel", "qkv/bias",
                 "attention_norm/gamma", "ffn_norm/beta", "embeddings_norm/gamma"]


@pytest.mark.parametrize("build, kinds", [
    (lambda: build_masked_lm(MODEL, vocab_size=50, max_length=8), ["mlm_head/output_bias", "mlm_head/norm/gamma"]),
    (lambda: build_classifier(MODEL, vocab_size=50, max_length=8, num_labels=3), ["pooler/kernel", "logits/bias"]),
], ids=["masked_lm", "classifier"])
def test_weight_decay_on_the_real_model_hits_every_matrix_and_no_bias_or_layernorm(build, kinds):
    """The real models' variables, by what they are: every kernel and embedding table (2-D or
    more) is decayed; every bias and LayerNorm gamma/beta (1-D) is not."""
    model = build()
    variables = model.trainable_variables
    optimizer = make_optimizer(peak=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5)
    optimizer.build(variables)
    for variable in variables:  # biases and betas start at 0, where decay cannot show
        variable.assign(np.ones(variable.shape, "float32"))
    optimizer.apply([tf.zeros(v.shape) for v in variables], variables)  # only weight decay can move them
    decayed = {v.path for v in variables if not np.all(v.numpy() == 1.0)}
    matrices = {v.path for v in variables if len(v.shape) >= 2}
    assert decayed == matrices
    paths = " ".join(sorted(v.path for v in variables))  # the model has each kind being checked
    for kind in ENCODER_KINDS + kinds:
        assert kind in paths, kind


# --- fp16 loss scale ------------------------------------------------------------------------

def updates(scale: DynamicLossScale, finite: list[bool]) -> list[float]:
    seen = []
    for ok in finite:
        scale.update(tf.constant(ok))
        seen.append(float(scale.scale.numpy()))
    return seen


def test_loss_scale_doubles_after_exactly_growth_interval_finite_steps():
    scale = DynamicLossScale(initial=8.0, growth_interval=3)
    assert updates(scale, [True] * 7) == [8, 8, 16, 16, 16, 32, 32]
    assert int(scale.good_steps) == 1 and int(scale.skipped_steps) == 0


def test_loss_scale_halves_on_overflow_and_counts_the_skipped_step():
    scale = DynamicLossScale(initial=2.0**15, growth_interval=3)
    # An overflow halves the scale and restarts the count of good steps towards growth.
    assert updates(scale, [True, True, False, True, True, False, False]) == [2**15, 2**15, 2**14, 2**14, 2**14,
                                                                             2**13, 2**12]
    assert int(scale.skipped_steps) == 3 and int(scale.good_steps) == 0
    assert updates(scale, [True] * 3) == [2**12, 2**12, 2**13]


def test_loss_scale_never_drops_below_one():
    scale = DynamicLossScale(initial=2.0, growth_interval=100)
    assert updates(scale, [False] * 3) == [1, 1, 1]
    assert int(scale.skipped_steps) == 3


def test_default_loss_scale_starts_at_2_to_the_15():
    scale = DynamicLossScale()
    assert float(scale.scale) == 32768.0 and scale.growth_interval == 2000


# --- dense gradients ------------------------------------------------------------------------

def embedding_gradient(embedding):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((embedding(IDS) - TARGET) ** 2)
    return tape.gradient(loss, embedding.trainable_variables)


def make_embedding():
    embedding = keras.layers.Embedding(VOCAB, D)
    embedding.build()
    embedding.embeddings.assign(E0)
    return embedding


def test_embedding_gradient_becomes_dense_per_id_sum():
    (sparse,) = embedding_gradient(make_embedding())
    assert isinstance(sparse, tf.IndexedSlices)
    assert sparse.values.shape[0] == len(IDS)  # one row per occurrence
    (dense,) = dense_gradients([sparse])
    assert not isinstance(dense, tf.IndexedSlices)
    assert isinstance(dense, tf.Tensor) and tuple(dense.shape) == (VOCAB, D)
    manual = np.zeros((VOCAB, D), "float32")
    np.add.at(manual, IDS, 2 * (E0[IDS] - TARGET))
    np.testing.assert_allclose(dense.numpy(), manual, rtol=1e-6, atol=1e-6)


def test_dense_gradients_leaves_other_entries_alone():
    tensor = tf.ones([2, 2])
    out = dense_gradients([tensor, None])
    assert out[0] is tensor and out[1] is None


def train_three_steps(gradient_fn, variables, transform=lambda g: g):
    optimizer = make_optimizer(peak=0.05, warmup_steps=1, total_steps=10, weight_decay=0.01)
    for _ in range(3):
        optimizer.apply(transform(gradient_fn()), variables)
    return np.asarray(variables[0])


def one_hot_reference():
    """The same loss through a dense one-hot matmul: what AdamW's math is defined on."""
    matrix = keras.Variable(E0, name="embeddings")

    def gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((tf.one_hot(IDS, VOCAB) @ matrix - TARGET) ** 2)
        gradients = tape.gradient(loss, [matrix])
        assert not isinstance(gradients[0], tf.IndexedSlices)
        return gradients

    return train_three_steps(gradient, [matrix])


@pytest.mark.parametrize("clip_norm", [0.5, 1e6])  # clipped, and left alone
def test_normalized_and_clipped_is_division_then_global_norm_clipping(clip_norm):
    sums = [tf.constant(np.random.default_rng(0).normal(size=shape) * 40, tf.float32) for shape in [(3, 4), (5,)]]
    divisor = tf.constant(8.0)
    expected, expected_norm = tf.clip_by_global_norm([g / divisor for g in sums], clip_norm)
    gradients, norm, nonfinite = normalized_and_clipped(sums, divisor, clip_norm)
    for got, want in zip(gradients, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    np.testing.assert_allclose(norm.numpy(), expected_norm.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(nonfinite.numpy(), [0.0, 0.0])


def test_normalized_and_clipped_flags_each_non_finite_gradient():
    sums = [tf.ones((2, 2)), tf.constant([1.0, np.nan]), tf.constant([np.inf]), tf.zeros((3,))]
    _, norm, nonfinite = normalized_and_clipped(sums, tf.constant(1.0), 1.0)
    np.testing.assert_array_equal(nonfinite.numpy(), [0.0, 1.0, 1.0, 0.0])
    assert not np.isfinite(norm.numpy())


def test_adamw_on_dense_gradients_matches_dense_math():
    embedding = make_embedding()
    ours = train_three_steps(lambda: embedding_gradient(embedding), embedding.trainable_variables, dense_gradients)
    reference = one_hot_reference()
    assert np.abs(ours - E0).max() > 1e-2  # the steps really moved the weights
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


def test_adamw_on_raw_slices_does_not_match_dense_math():
    """Why dense_gradients exists: with repeated ids, slices give a different update."""
    embedding = make_embedding()
    raw = train_three_steps(lambda: embedding_gradient(embedding), embedding.trainable_variables)
    assert np.abs(raw - one_hot_reference()).max() > 1e-3


# --- layer-wise learning-rate decay (train.layer_decay) -------------------------------------
# AdamW's first step moves every weight by lr * g / (|g| + eps'): by the learning rate itself
# wherever the gradient is not tiny. So max |update| / lr of a variable is the factor its rate
# was scaled by, whatever its gradient: the step shows which rate each variable got.

LR, LABELS = 1e-3, ["neg", "pos", "neutral"]


def expected_factor(path: str, decay: float) -> float:
    """The rule for a 2-block classifier, written out by name (not by the code under test): the
    head at the full rate, the top block (and the pre-LN final norm on it) x decay, block 0
    x decay^2, everything under the blocks x decay^3."""
    if path.startswith("classifier_head/"):
        return 1.0
    if path.startswith(("block_1/", "final_norm/")):
        return decay
    if path.startswith("block_0/"):
        return decay**2
    if path.startswith(("token_embedding/", "position_embedding/", "embeddings_norm/")):
        return decay**3
    raise AssertionError(f"a variable the rule does not cover: {path}")


def layer_decay_config(decay: float, norm: str = "pre", position: str = "sinusoidal", weight_decay: float = 0.0):
    return load_config(None, [
        "task.type=classify", "model.d_model=16", "model.num_layers=2", "model.num_heads=2", "model.dff=32",
        f"model.norm={norm}", f"model.position={position}", "data.seq_len=8", "train.batch_size=8", "train.steps=10",
        "train.warmup_steps=0", f"train.learning_rate={LR}", f"train.weight_decay={weight_decay}",
        f"train.layer_decay={decay}", "train.precision=fp32"])


def first_step_factors(config, strategy) -> dict[str, float]:
    """One real Trainer step (build_trainer: what `train` runs) on a fixed batch: {variable
    path: max |update| / learning rate}."""
    from trainformer.data.pipeline import distribute
    from trainformer.tasks.classify import ClassifyTask

    task = ClassifyTask(config)
    task.vocab_size, task.labels = 50, LABELS  # what prepare() would read from the run
    keras.utils.set_random_seed(0)
    trainer = build_trainer(config, task, strategy)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 50, (8, 8)).astype("int32")
    ids[:, 6:] = 0  # some padding
    batch = ({"token_ids": ids, "padding_mask": ids != 0}, {"labels": rng.integers(0, 3, 8).astype("int32")})
    before = {v.path: v.numpy() for v in trainer.model.trainable_variables}
    trainer.train_step(iter(distribute(strategy, tf.data.Dataset.from_tensors(batch).repeat())))
    return {v.path: float(np.abs(v.numpy() - before[v.path]).max()) / LR for v in trainer.model.trainable_variables}


@pytest.mark.parametrize("decay, norm, position", [(0.5, "pre", "sinusoidal"), (0.5, "post", "learned"),
                                                   (1.0, "pre", "sinusoidal")])
def test_layer_decay_gives_each_layer_its_learning_rate(decay, norm, position):
    """decay 1.0 is the control (Keras's own step): every factor 1. Post-LN with learned
    positions has the embeddings norm and position table; pre-LN the final norm."""
    factors = first_step_factors(layer_decay_config(decay, norm, position), tf.distribute.get_strategy())
    for path, factor in factors.items():
        assert factor == pytest.approx(expected_factor(path, decay), rel=1e-2), path


def test_layer_decay_scales_the_decoupled_weight_decay_too():
    """Zero gradients: only weight decay moves a weight, by lr * wd * factor * w (matrices; no
    bias or LayerNorm is decayed at any depth)."""
    model = build_classifier(ModelConfig(d_model=16, num_layers=2, num_heads=2, dff=32, dropout=0.0), 50, 8, 3)
    variables = model.trainable_variables
    optimizer = make_optimizer(peak=0.1, warmup_steps=0, total_steps=10, weight_decay=0.5,
                               lr_multipliers=layer_decay_multipliers(model, 0.5))
    optimizer.build(variables)
    for variable in variables:
        variable.assign(np.ones(variable.shape, "float32"))
    optimizer.apply([tf.zeros(v.shape) for v in variables], variables)
    for variable in variables:
        decayed = 1.0 - variable.numpy()
        expected = 0.1 * 0.5 * expected_factor(variable.path, 0.5) if len(variable.shape) >= 2 else 0.0
        np.testing.assert_allclose(decayed, expected, rtol=1e-5, atol=1e-7, err_msg=variable.path)


def test_layer_decay_leaves_the_checkpointed_optimizer_state_as_it_was(tmp_path):
    """The factors live in the config, not in variables: a checkpoint holds the same slots with
    or without them, so either restores the other's."""
    names = []
    for multipliers in (False, True):
        model = build_classifier(ModelConfig(d_model=16, num_layers=1, num_heads=2, dff=32), 50, 8, 3)
        optimizer = make_optimizer(1e-3, 0, 10, 0.01, layer_decay_multipliers(model, 0.8) if multipliers else None)
        optimizer.build(model.trainable_variables)
        path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / f"{multipliers}/ckpt"))
        names.append([name for name, _ in tf.train.list_variables(path)])
    assert names[0] == names[1]


def test_a_variable_without_a_factor_is_an_error():
    kernel = keras.Variable(np.ones(3, "float32"), name="kernel")
    bias = keras.Variable(np.ones(3, "float32"), name="bias")
    optimizer = make_optimizer(1e-3, 0, 10, 0.0, lr_multipliers={kernel.path: 0.5})
    with pytest.raises(ValueError, match="no factor for bias"):
        optimizer.build([kernel, bias])


MIRRORED = """
import json, sys
sys.path.insert(0, sys.argv[1])
from trainformer.config import RuntimeConfig
from trainformer.train.strategy import configure_devices, make_strategy
configure_devices(RuntimeConfig(cpu_devices=2))
from test_optim import first_step_factors, layer_decay_config
strategy = make_strategy("mirrored")
print(json.dumps([strategy.num_replicas_in_sync, first_step_factors(layer_decay_config(0.5), strategy)]))
"""


def test_layer_decay_under_mirrored_strategy_on_two_cpus():
    """Each replica updates its copy of a variable: the factor is found for the copy too."""
    here = str(Path(__file__).parent)
    result = subprocess.run([sys.executable, "-c", MIRRORED, here], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    replicas, factors = json.loads(result.stdout.strip().splitlines()[-1])
    assert replicas == 2 and len(factors) == 31  # every trainable variable of the pre-LN 2-block classifier
    for path, factor in factors.items():
        assert factor == pytest.approx(expected_factor(path, 0.5), rel=1e-2), path
