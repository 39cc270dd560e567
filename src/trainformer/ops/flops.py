"""The FLOP model behind MFU: what one training step of a masked-LM BERT must compute.

Shared with benchmarks/ (same formula as the peer harness), so MFU is comparable across
frameworks: work a model does beyond this (e.g. vocabulary logits on unmasked positions) is
not credited.
"""

from __future__ import annotations

from trainformer.config import ModelConfig


def train_flops_per_step(model: ModelConfig, vocab_size: int, batch: int, seq_len: int, mask_rate: float) -> float:
    """3 x forward matmul FLOPs (the backward pass costs twice the forward).

    Per token and layer: 2 x (4d^2 + 2 d dff) for the dense layers plus 4 x seq x d for QK^T
    and AV (PaLM's attention term). The MLM head (d -> d transform and the tied d -> vocab
    projection) counts on the masked share of tokens only. Embedding lookups, LayerNorm,
    softmax, GELU and biases are not counted.
    """
    d, layers, dff = model.d_model, model.num_layers, model.dff
    tokens = batch * seq_len
    encoder = tokens * layers * (2 * (4 * d * d + 2 * d * dff) + 4 * seq_len * d)
    head = mask_rate * tokens * 2 * (d * d + d * vocab_size)
    return 3.0 * (encoder + head)
