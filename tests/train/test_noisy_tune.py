"""NoisyTune's noise (train.noisy_tune): each tensor moves by uniform noise of width scale x its
own standard deviation, drawn from the seed. The fine-tune that uses it end to end, resumed to
the bit, is tests/test_classify.py's finetuned and kept_best fixtures."""

import keras
import numpy as np

from trainformer.train.noisy_tune import perturb


def variables(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [keras.Variable(rng.normal(0, 0.02, (64, 32)).astype("float32")),  # a projection: small spread
            keras.Variable((1 + rng.normal(0, 0.1, (32,))).astype("float32"))]  # a LayerNorm scale near 1


def test_each_tensor_moves_by_uniform_noise_scaled_by_its_own_spread():
    before = [v.numpy() for v in variables()]
    after = variables()
    perturb(after, 0.15, seed=42)
    for old, new in zip(before, after):
        delta = new.numpy() - old
        half_width = 0.15 / 2 * old.std()
        assert np.abs(delta).max() <= half_width * 1.0001  # inside U(-0.075 std, 0.075 std)
        assert np.abs(delta).max() > 0.9 * half_width  # and it fills it: the noise is uniform
        assert abs(np.abs(delta).mean() - half_width / 2) < 0.1 * half_width  # E|U(-h, h)| = h / 2


def test_the_seed_draws_the_noise():
    first, again, other = variables(), variables(), variables()
    perturb(first, 0.15, seed=42)
    perturb(again, 0.15, seed=42)
    perturb(other, 0.15, seed=7)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(first, again))
    assert not np.array_equal(first[0].numpy(), other[0].numpy())
