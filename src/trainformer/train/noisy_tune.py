"""NoisyTune (Wu et al. 2022, "NoisyTune: A Little Noise Can Help You Finetune Pretrained Language
Models Better", ACL): before a fine-tune's first step, each pretrained weight tensor W gets
uniform noise of width `scale` times its own standard deviation,

    W += U(-scale / 2, scale / 2) * std(W)

so every tensor moves in proportion to its own spread (a LayerNorm scale near 1 barely, an
embedding table more). Drawn once, from the run's seed: a resumed run restores the perturbed
weights from its checkpoint and does not draw again."""

import numpy as np


def perturb(variables: list, scale: float, seed: int) -> None:
    """Add NoisyTune's noise to each variable in place (the same draw on every worker: the seed
    and the variables' order are theirs alike)."""
    rng = np.random.default_rng(seed)
    for variable in variables:
        value = variable.numpy()
        noise = rng.uniform(-0.5, 0.5, value.shape) * scale * value.std()
        variable.assign((value + noise).astype(value.dtype))
