"""The correspondence between a Hugging Face BERT and our Keras model, written once and read in
both directions: `trainformer import hf` (hf_import.py) and `export --format hf` (hf_export.py).

Weights. Each `Tie` joins one variable of ours to the HF tensor(s) it is:

    ours (model/encoder.py, heads.py)          HF name (BertModel-relative; heads keep cls./classifier.)
    encoder token_embedding                    embeddings.word_embeddings.weight
    encoder position_embedding                 embeddings.position_embeddings.weight  (+ token types, below)
    encoder embeddings_norm gamma / beta       embeddings.LayerNorm.weight / .bias
    block_i qkv kernel (d, 3d) / bias (3d,)    encoder.layer.i.attention.self.{query,key,value}.weight / .bias
    block_i attention_output, attention_norm   encoder.layer.i.attention.output.dense, .LayerNorm
    block_i ffn_inner, ffn_output, ffn_norm    encoder.layer.i.intermediate.dense, output.dense, output.LayerNorm
    mlm_head transform, norm                   cls.predictions.transform.dense, .transform.LayerNorm
    mlm_head output_bias                       cls.predictions.bias
    pooler (dense + tanh on [CLS])             pooler.dense
    classifier_head logits                     classifier

An HF Linear weight is (out, in), our Keras kernel (in, out): a `linear` Tie transposes. Our
fused qkv kernel is the three HF matrices transposed and concatenated along its last axis
([Wq^T | Wk^T | Wv^T]; each splits as (heads, head_dim), as HF's do): a Tie with three names
splits or joins along that axis. Transposes, splits and joins move bits, never round them.

What has no Tie, and why:
- The MLM output matrix: ours is the token embedding (tied), as BertForMaskedLM's decoder is
  (tie_word_embeddings true). A saved untied decoder is refused by the import.
- token_type_embeddings: our encoder has no segment input. The import folds row 0 into the
  position table (exact for single-segment input, what every task here feeds); the export
  writes TOKEN_TYPES rows of zeros, so HF adds nothing and segment 1 is read as segment 0.

Config keys: CONFIG_KEYS and HF_ACTIVATIONS below, used both ways as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np

from trainformer.model.heads import Classifier, ClassifierHead, MaskedLM

# HF config key <-> ModelConfig attribute, where the two are the same number.
CONFIG_KEYS = (("hidden_size", "d_model"), ("num_hidden_layers", "num_layers"),
               ("num_attention_heads", "num_heads"), ("intermediate_size", "dff"))
# ModelConfig.activation -> HF hidden_act. gelu: x * Phi(x) (erf form) both sides. gelu_tanh:
# Keras' gelu(approximate=True) is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the formula
# of HF's gelu_new (and of torch's gelu(approximate="tanh"), HF's gelu_pytorch_tanh). relu2:
# relu(x)^2, HF's ReLUSquaredActivation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu2": "relu2"}
# HF hidden_act -> ours, the import's (both tanh forms are our gelu_tanh)
HIDDEN_ACTS = {**{hf: ours for ours, hf in HF_ACTIVATIONS.items()}, "gelu_pytorch_tanh": "gelu_tanh"}
EPSILON = 1e-12  # our LayerNorms' (model/encoder.py, layers.py), BERT's layer_norm_eps
TOKEN_TYPES = 2  # rows of the exported token_type_embeddings (BERT's type_vocab_size)
WORDS = "embeddings.word_embeddings.weight"
POSITIONS = "embeddings.position_embeddings.weight"
TOKEN_TYPE_TABLE = "embeddings.token_type_embeddings.weight"
OUTPUT_BIAS = "cls.predictions.bias"
BACKBONE = ("embeddings.", "encoder.", "pooler.")  # what BertFor* models keep under "bert."


@dataclass(frozen=True)
class Tie:
    """One variable of ours and the HF tensor(s) it holds.

    names: one HF tensor, or several that our variable joins along its last axis (qkv).
    linear: HF stores the transpose (a Linear weight (out, in) against a kernel (in, out)).
    """

    variable: keras.Variable
    names: tuple[str, ...]
    linear: bool = False

    def hf_shapes(self) -> list[tuple[int, ...]]:
        """The shape each HF tensor must have."""
        *rest, last = tuple(self.variable.shape)
        piece = (*rest, last // len(self.names))
        return [piece[::-1] if self.linear else piece] * len(self.names)

    def to_hf(self) -> dict[str, np.ndarray]:
        """Our variable's value as the HF tensor(s) (float32, C-contiguous: what safetensors writes)."""
        value = np.asarray(self.variable.numpy(), np.float32)
        pieces = np.split(value, len(self.names), axis=-1)
        return {name: np.ascontiguousarray(piece.T if self.linear else piece)
                for name, piece in zip(self.names, pieces)}

    def from_hf(self, tensors: list[np.ndarray]) -> np.ndarray:
        """The value of our variable made of the HF tensor(s), in the order of `names`."""
        pieces = [tensor.T if self.linear else tensor for tensor in tensors]
        return np.concatenate(pieces, axis=-1).astype(np.float32)


def full_name(name: str) -> str:
    """The name in a BertFor* checkpoint: backbone tensors live under "bert."."""
    return f"bert.{name}" if name.startswith(BACKBONE) else name


def dense(layer: keras.layers.Dense, name: str) -> list[Tie]:
    return [Tie(layer.kernel, (f"{name}.weight",), linear=True), Tie(layer.bias, (f"{name}.bias",))]


def layer_norm(layer: keras.layers.LayerNormalization, name: str) -> list[Tie]:
    return [Tie(layer.gamma, (f"{name}.weight",)), Tie(layer.beta, (f"{name}.bias",))]


def encoder_ties(encoder: keras.Model) -> list[Tie]:
    """Embeddings and every block of a post-LN, learned-position encoder (BERT's layout)."""
    ties = [Tie(encoder.token_embedding.embeddings, (WORDS,)),
            Tie(encoder.get_layer("position_embedding").positions, (POSITIONS,)),
            *layer_norm(encoder.get_layer("embeddings_norm"), "embeddings.LayerNorm")]
    for index in range(encoder.num_layers):
        block, prefix = encoder.get_layer(f"block_{index}"), f"encoder.layer.{index}."
        ties += [Tie(block._qkv.kernel, tuple(f"{prefix}attention.self.{p}.weight" for p in ("query", "key", "value")),
                     linear=True),
                 Tie(block._qkv.bias, tuple(f"{prefix}attention.self.{p}.bias" for p in ("query", "key", "value"))),
                 *dense(block._attention_output, f"{prefix}attention.output.dense"),
                 *layer_norm(block._attention_norm, f"{prefix}attention.output.LayerNorm"),
                 *dense(block._ffn_inner, f"{prefix}intermediate.dense"),
                 *dense(block._ffn_output, f"{prefix}output.dense"),
                 *layer_norm(block._ffn_norm, f"{prefix}output.LayerNorm")]
    return ties


def mlm_head_ties(model: MaskedLM) -> list[Tie]:
    """The MLM head but its output matrix, which is the token embedding (tied)."""
    head = model.get_layer("mlm_head")
    return [*dense(head._transform, "cls.predictions.transform.dense"),
            *layer_norm(head._norm, "cls.predictions.transform.LayerNorm"),
            Tie(head.output_bias, (OUTPUT_BIAS,))]


def pooler_ties(pooler: keras.layers.Dense) -> list[Tie]:
    return dense(pooler, "pooler.dense")


def classifier_head_ties(head: ClassifierHead) -> list[Tie]:
    """BertForSequenceClassification's pooler and classifier."""
    return pooler_ties(head.pooler) + dense(head.logits, "classifier")


def model_ties(model: MaskedLM | Classifier) -> list[Tie]:
    """Every weight of a MaskedLM (as BertForMaskedLM) or a Classifier (as BertForSequenceClassification)."""
    head = mlm_head_ties(model) if isinstance(model, MaskedLM) else classifier_head_ties(model.head)
    return encoder_ties(model.encoder) + head


def zero_token_types(d_model: int) -> np.ndarray:
    """The exported token_type_embeddings: zeros, so BERT's sum is ours (see the module docstring)."""
    return np.zeros((TOKEN_TYPES, d_model), np.float32)


def fold_token_types(positions: np.ndarray, token_types: np.ndarray) -> np.ndarray:
    """The imported position table: BERT adds token_type_embeddings[0] at every position of a
    single-segment input; ours adds it with the position."""
    return positions + token_types[0]
