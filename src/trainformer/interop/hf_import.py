"""Import a Hugging Face BERT checkpoint folder as a trainformer run directory.

`trainformer import hf HF_DIR --run-dir RUN_DIR` runs `import_hf_bert`. HF_DIR is what
`save_pretrained` writes for a BERT-family model (bert-base-chinese, its fine-tunes, any
BertModel / BertForMaskedLM / BertForPreTraining / BertForSequenceClassification):

    config.json             model_type "bert"; sizes, hidden_act, layer_norm_eps, ...
    model.safetensors       the weights (or model.safetensors.index.json + shards); float32,
                            float16 or bfloat16, read as float32. pytorch_model.bin is not read
                            (a pickle can run code): the error says how to convert it.
    vocab.txt               the WordPiece vocabulary
    tokenizer_config.json   optional: do_lower_case (BERT's default: true)

What the import does, exactly (the parity test proves the result computes what `transformers`
computes, within 1e-4 in float32, on the fixture tests/fixtures/tiny-hf-bert):

- Encoder: BERT is a post-LN encoder with learned positions: our `norm: post`,
  `position: learned`. BERT's embedding LayerNorm is our `embeddings_norm`; per layer, the
  separate query/key/value Linears become our fused `qkv` Dense (kernel [Wq^T | Wk^T | Wv^T],
  (d, 3d)), attention.output.dense/LayerNorm -> attention_output/attention_norm,
  intermediate.dense -> ffn_inner, output.dense/LayerNorm -> ffn_output/ffn_norm. HF Linear
  weights are (out, in) and are transposed into Keras kernels (in, out). hidden_act "gelu"
  becomes `activation: gelu` (exact, erf form), "gelu_new"/"gelu_pytorch_tanh" `gelu_tanh`.
- Token types: our encoder has no segment input. Every task here feeds one segment, for which
  BERT adds token_type_embeddings[0] at every position; that row is folded into the learned
  position table (positions[p] = position_embeddings[p] + token_type_embeddings[0]), which is
  exact for single-segment input. Segment pairs (token type 1) cannot be expressed.
- Vocabulary: trainformer needs [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0-4; bert-base-chinese has
  them at 0, 100, 101, 102, 103. The vocabulary is reordered (the five specials first, every
  other token in its original order after them) and the token-embedding rows and the MLM output
  bias are permuted the same way: exact, ids simply change. tokenizer/ holds the reordered
  vocab.txt and tokenizer.json (lowercase = do_lower_case). Our tokenizer applies NFKC before
  WordPiece; HF's BertTokenizer does not, so full-width forms may tokenize differently.
- MLM head: cls.predictions.transform.dense/LayerNorm -> mlm_head transform/norm, the output
  matrix is the (tied) token embedding, cls.predictions.bias -> output_bias. A checkpoint
  without cls.predictions.* (BertModel, a classification fine-tune) gets a fresh head
  (kernel ~ N(0, initializer_range), zero bias, unit LayerNorm): the summary says so. An untied
  decoder matrix is refused.
- Pooler: bert.pooler.dense (dense + tanh on [CLS]) is kept for a classifier built later
  (model/heads.py ClassifierHead.pooler); without it the pooler starts fresh like the head.
- Dropped on purpose (listed in the summary): cls.seq_relationship.* (next-sentence head),
  the position_ids / token_type_ids buffers, and classifier.* of a fine-tuned classifier (its
  labels are not known here; a later import may map it onto ClassifierHead.logits).
Any other tensor, a missing one, or a shape that does not fit is an error naming the key, and
every variable of our model must receive a tensor (or be one of the fresh ones above), so a
wrong mapping cannot pass silently.

The run directory written (nothing is written on any error: everything is checked and computed
in memory first, written into a hidden sibling folder, and renamed into place at the end; an
existing non-empty RUN_DIR is refused):

    config.yaml      a full ExperimentConfig: task.type mlm, model.{d_model, num_layers,
                     num_heads, dff, dropout (hidden_dropout_prob), norm post, position learned,
                     activation, max_length = max_position_embeddings}, data.seq_len
                     min(128, max_length), tokenizer.{vocab_size, lowercase}; other keys default
    manifest.json    name, num_params, vocab_size, imported_from {format, source, files with
                     their sha256, architectures, transformers_version, mapped/dropped/fresh},
                     created_at, and the environment (packages, git rev) as train writes it
    tokenizer/       vocab.txt (specials first) + tokenizer.json
    checkpoints/     ckpt-0.* and `checkpoint`, found by tf.train.latest_checkpoint

The checkpoint (tf.train.Checkpoint, saved by train/checkpoint.py Checkpoints) holds exactly:

    model    the MaskedLM of config.yaml (model/heads.py build_masked_lm with
             max_length = model.max_length): model.encoder + model's mlm_head
    pooler   a keras.layers.Dense(d_model, activation="tanh", name="pooler"), built on d_model
    step     tf.Variable(0, int64)

so `restore_model(build_masked_lm(...), path)` (trainformer eval) loads it as it is, and an
encoder (+ pooler) for another task is restored with

    tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=classifier.encoder),
                        pooler=classifier.head.pooler).restore(path).expect_partial()

(tests/test_hf_import.py does exactly that and checks the pooled output against transformers').
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from trainformer.config import (
    DataConfig, ExperimentConfig, ModelConfig, TaskConfig, TokenizerConfig, validate,
)
from trainformer.data.tokenizer import VOCAB_FILE, Tokenizer, _write_vocab
from trainformer.tokens import SPECIAL_TOKENS
from trainformer.errors import UserError
from trainformer.files import read_json
from trainformer.model.heads import MaskedLM, build_masked_lm
from trainformer.train.checkpoint import Checkpoints
from trainformer.run_dir import RunDir, environment, now

SUPPORTED_MODEL_TYPES = ("bert",)
HIDDEN_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
EPSILON = 1e-12  # our LayerNorms' (model/encoder.py, layers.py)
SEQ_LEN = 128  # data.seq_len of the imported config (capped at max_position_embeddings)
# BertConfig's defaults: a config.json may leave out what equals them.
BERT_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
    "is_decoder": False, "add_cross_attention": False,
}
# Tensors left out on purpose: (prefix, why).
DROPPED = (
    ("cls.seq_relationship.", "next-sentence-prediction head (NSP): no task here uses it"),
    ("classifier.", "classification layer of a fine-tune: its labels are not known here (not imported)"),
    ("embeddings.position_ids", "buffer, not a weight"),
    ("embeddings.token_type_ids", "buffer, not a weight"),
)
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
PYTORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass
class Source:
    """What an HF_DIR holds, read and checked."""

    folder: Path
    config: dict  # config.json with BERT's defaults filled in
    tensors: dict[str, np.ndarray]  # float32, keys without the "bert." prefix
    files: dict[str, str]  # weight file name -> sha256
    vocab: list[str]  # vocab.txt in its original order
    lowercase: bool
    notes: list[str] = field(default_factory=list)  # things the summary should say

    @property
    def weights_name(self) -> str:
        single = "model.safetensors" in self.files
        return str(self.folder / ("model.safetensors" if single else "model.safetensors.index.json"))


def import_hf_bert(hf_dir: Path, run_dir: Path, say=print) -> dict:
    """Convert the Hugging Face BERT checkpoint folder hf_dir into a new run directory run_dir.

    Returns a summary: run_dir, checkpoint, num_params, vocab_size, layers, d_model, heads, dff,
    max_length, activation, lowercase, mapped (HF tensors used), dropped ({key: why}), fresh
    (our weights that start untrained), notes. Raises UserError (one line naming the file and
    key) with nothing written when hf_dir cannot be imported or run_dir is not new or empty.
    """
    hf_dir, run_dir = Path(hf_dir).expanduser(), Path(run_dir).expanduser()
    _check_new_run_dir(run_dir)
    source = read_source(hf_dir)
    config = experiment_config(source, run_dir.resolve().name)
    vocab, order = reorder_vocabulary(source)
    Tokenizer(vocab, lowercase=source.lowercase)  # tf-text accepts the vocabulary
    model, pooler, mapping = convert(source, config, order)
    summary = {
        "run_dir": str(run_dir), "num_params": model.count_params(), "vocab_size": len(vocab),
        "layers": config.model.num_layers, "d_model": config.model.d_model, "heads": config.model.num_heads,
        "dff": config.model.dff, "max_length": config.model.max_length, "activation": config.model.activation,
        "lowercase": source.lowercase, **mapping, "notes": source.notes,
    }
    manifest = {
        "name": config.name,
        "num_params": summary["num_params"],
        "vocab_size": len(vocab),
        "imported_from": {
            "format": "huggingface-bert",
            "source": str(hf_dir.resolve()),
            "files": source.files,
            "architectures": source.config.get("architectures"),
            "transformers_version": source.config.get("transformers_version"),
            "mapped": len(mapping["mapped"]),
            "dropped": mapping["dropped"],
            "fresh": mapping["fresh"],
        },
        "created_at": now(),
        **environment(),
    }
    summary["checkpoint"] = str(run_dir / "checkpoints" / _write_run(run_dir, config, vocab, source.lowercase,
                                                                      model, pooler, manifest))
    _say_summary(say, source, summary)
    return summary


# --- reading HF_DIR -------------------------------------------------------------------------

def read_source(hf_dir: Path) -> Source:
    if not hf_dir.is_dir():
        raise UserError(f"{hf_dir}: no such directory (expected a Hugging Face model folder: config.json, "
                        f"model.safetensors, vocab.txt)")
    config = _read_config(hf_dir / "config.json")
    vocab = _read_vocab(hf_dir / VOCAB_FILE)
    lowercase, notes = _read_lowercase(hf_dir / "tokenizer_config.json")
    tensors, files = _read_weights(hf_dir)  # last: the slow part
    source = Source(hf_dir, config, {}, files, vocab, lowercase, notes)
    source.tensors = _strip_prefix(tensors, source.weights_name)
    return source


def _read_config(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: no such file (a Hugging Face model folder has config.json)")
    raw = read_json(path)
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        shown = f"model_type {model_type!r}" if model_type is not None else "no model_type"
        raise UserError(f"{path}: {shown} is not a BERT-family encoder (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    config = {**BERT_DEFAULTS, **raw}
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size"):
        value = config[key]
        least = 0 if key == "type_vocab_size" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise UserError(f"{path}: {key}: expected an integer >= {least}, got {value!r}")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise UserError(f"{path}: hidden_size {config['hidden_size']} is not divisible by num_attention_heads "
                        f"{config['num_attention_heads']}")
    if config["hidden_act"] not in HIDDEN_ACTS:
        raise UserError(f"{path}: hidden_act {config['hidden_act']!r} is not supported "
                        f"(supported: {', '.join(HIDDEN_ACTS)})")
    eps = config["layer_norm_eps"]
    if not isinstance(eps, (int, float)) or not math.isclose(eps, EPSILON, rel_tol=1e-6):
        raise UserError(f"{path}: layer_norm_eps {eps!r} is not supported (trainformer's LayerNorms use {EPSILON:g}, "
                        f"BERT's)")
    if config["position_embedding_type"] != "absolute":
        raise UserError(f"{path}: position_embedding_type {config['position_embedding_type']!r} is not supported "
                        f"(supported: absolute)")
    for key in ("is_decoder", "add_cross_attention"):
        if config[key]:
            raise UserError(f"{path}: {key} is true: only BERT encoders can be imported")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range"):
        if not isinstance(config[key], (int, float)) or isinstance(config[key], bool):
            raise UserError(f"{path}: {key}: expected a number, got {config[key]!r}")
    return config


def _read_weights(hf_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    single, index = hf_dir / "model.safetensors", hf_dir / "model.safetensors.index.json"
    if single.is_file():
        paths = [single]
    elif index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{index}: no weight_map")
        paths = [hf_dir / name for name in sorted(set(weight_map.values()))]
        for path in paths:
            if not path.is_file():
                raise UserError(f"{index}: names {path.name}, which is not in {hf_dir}")
    else:
        found = [name for name in PYTORCH_FILES if (hf_dir / name).is_file()]
        if found:
            bin_path = hf_dir / found[0]
            raise UserError(
                f"{hf_dir}: no model.safetensors ({found[0]} is not read: a pickle can run code); convert it "
                f"once with: python -c \"import torch, safetensors.torch as s; s.save_file({{k: v.clone() for k, v in "
                f"torch.load('{bin_path}', weights_only=True).items()}}, '{single}')\" or save the model with "
                f"save_pretrained(dir, safe_serialization=True)")
        others = [name for name in ("tf_model.h5", "flax_model.msgpack") if (hf_dir / name).is_file()]
        extra = (f" ({others[0]} is not read: save the model with save_pretrained(dir, safe_serialization=True))"
                 if others else "")
        raise UserError(f"{hf_dir}: no model.safetensors{extra}")
    tensors, files = {}, {}
    for path in paths:
        files[path.name] = _sha256(path)
        for key, value in _load_safetensors(path).items():
            if key in tensors:
                raise UserError(f"{path}: {key} is also in another shard")
            tensors[key] = value
    return tensors, files


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as float32 numpy (float16 and bfloat16 widen exactly)."""
    import ml_dtypes  # noqa: F401  (Keras' dependency) makes numpy know "bfloat16"
    import safetensors.numpy

    try:
        raw = safetensors.numpy.load_file(str(path))
    except Exception as err:  # SafetensorError: a truncated or foreign file; TypeError: an unknown dtype
        raise UserError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:200]})") from None
    tensors = {}
    for key, value in raw.items():
        if key.endswith(("position_ids", "token_type_ids")):  # integer buffers
            tensors[key] = value
        elif value.dtype.name not in FLOAT_DTYPES:
            raise UserError(f"{path}: {key} holds {value.dtype}, not floating-point weights")
        else:
            tensors[key] = value.astype(np.float32)
    return tensors


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _strip_prefix(tensors: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """Keys as BertModel names them: "bert." removed (BertFor* models), old TF-era names
    (LayerNorm.gamma/beta) renamed as transformers renames them."""
    stripped = {}
    for key, value in tensors.items():
        name = key[len("bert."):] if key.startswith("bert.") else key
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if name in stripped:
            raise UserError(f"{where}: {key} is there with and without the 'bert.' prefix")
        stripped[name] = value
    if not any(name.startswith("embeddings.") for name in stripped):
        raise UserError(f"{where}: no BERT embeddings (bert.embeddings.* or embeddings.*): not a BERT checkpoint")
    return stripped


def _read_vocab(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"{path}: no such file (the WordPiece vocabulary, one token a line)")
    try:
        vocab = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    while vocab and not vocab[-1]:
        vocab.pop()
    for token in SPECIAL_TOKENS:
        count = vocab.count(token)
        if count != 1:
            raise UserError(f"{path}: {'has no' if not count else f'has {count} lines of the'} special token "
                            f"{token} (a BERT vocabulary has each of {' '.join(SPECIAL_TOKENS)} once)")
    return vocab


def _read_lowercase(path: Path) -> tuple[bool, list[str]]:
    if not path.is_file():
        return True, [f"no {path.name}: lowercase as BERT's default (do_lower_case true)"]
    settings = read_json(path)
    lowercase = settings.get("do_lower_case", True)
    if not isinstance(lowercase, bool):
        raise UserError(f"{path}: do_lower_case: expected true or false, got {lowercase!r}")
    notes = []
    strip_accents = settings.get("strip_accents")
    if strip_accents is not None and strip_accents != lowercase:
        notes.append(f"{path.name}: strip_accents {strip_accents} is not followed: trainformer strips accents "
                     f"exactly when it lowercases")
    if settings.get("tokenize_chinese_chars") is False:
        notes.append(f"{path.name}: tokenize_chinese_chars false is not followed: CJK characters are split singly")
    return lowercase, notes


# --- the trainformer side -------------------------------------------------------------------

def experiment_config(source: Source, name: str) -> ExperimentConfig:
    c = source.config
    max_length = c["max_position_embeddings"]
    config = ExperimentConfig(
        name=name,
        task=TaskConfig(type="mlm"),
        model=ModelConfig(
            d_model=c["hidden_size"], num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
            dff=c["intermediate_size"], dropout=float(c["hidden_dropout_prob"]), norm="post", position="learned",
            activation=HIDDEN_ACTS[c["hidden_act"]], max_length=max_length,
        ),
        data=DataConfig(seq_len=min(SEQ_LEN, max_length)),
        tokenizer=TokenizerConfig(vocab_size=len(source.vocab), lowercase=source.lowercase),
    )
    validate(config, f"{source.folder / 'config.json'} (as a trainformer config)")
    if c["attention_probs_dropout_prob"] != c["hidden_dropout_prob"]:
        source.notes.append(f"attention_probs_dropout_prob {c['attention_probs_dropout_prob']} differs from "
                            f"hidden_dropout_prob {c['hidden_dropout_prob']}: model.dropout is the latter, for both")
    if c["vocab_size"] != len(source.vocab):
        raise UserError(f"{source.folder / VOCAB_FILE}: {len(source.vocab)} tokens, but config.json vocab_size is "
                        f"{c['vocab_size']}")
    return config


def reorder_vocabulary(source: Source) -> tuple[list[str], np.ndarray]:
    """The vocabulary with SPECIAL_TOKENS first, and `order`: new id -> original id."""
    first = [source.vocab.index(token) for token in SPECIAL_TOKENS]
    taken = set(first)
    order = np.array(first + [i for i in range(len(source.vocab)) if i not in taken], dtype=np.int64)
    return [source.vocab[i] for i in order], order


def convert(source: Source, config: ExperimentConfig, order: np.ndarray) -> tuple[MaskedLM, keras.layers.Dense, dict]:
    """Build our MaskedLM + pooler and give every variable its HF tensor (in memory).

    Returns the model, the pooler and {"mapped": [HF keys], "dropped": {key: why},
    "fresh": [what starts untrained]}.
    """
    m = config.model
    model = build_masked_lm(m, len(order), m.max_length)  # float32
    pooler = keras.layers.Dense(m.d_model, activation="tanh", name="pooler")
    pooler.build((None, m.d_model))
    weights = _Weights(source)
    encoder = model.encoder

    # embeddings
    words = weights.take("embeddings.word_embeddings.weight", (len(order), m.d_model))
    weights.assign(encoder.token_embedding.embeddings, words[order])
    positions = weights.take("embeddings.position_embeddings.weight", (m.max_length, m.d_model))
    type_vocab = source.config["type_vocab_size"]
    if type_vocab:
        types = weights.take("embeddings.token_type_embeddings.weight", (type_vocab, m.d_model))
        positions = positions + types[0]  # single-segment input: token type 0 everywhere (exact)
    weights.assign(encoder.get_layer("position_embedding").positions, positions)
    weights.layer_norm(encoder.get_layer("embeddings_norm"), "embeddings.LayerNorm", m.d_model)

    for index in range(m.num_layers):
        block, prefix = encoder.get_layer(f"block_{index}"), f"encoder.layer.{index}."
        parts = ("query", "key", "value")
        qkv = [weights.take(f"{prefix}attention.self.{part}.weight", (m.d_model, m.d_model)) for part in parts]
        bias = [weights.take(f"{prefix}attention.self.{part}.bias", (m.d_model,)) for part in parts]
        # our kernel (d, 3d) splits as (3, heads, head_dim), HF's outputs as (heads, head_dim) each
        weights.assign(block._qkv.kernel, np.concatenate([w.T for w in qkv], axis=1))
        weights.assign(block._qkv.bias, np.concatenate(bias))
        weights.dense(block._attention_output, f"{prefix}attention.output.dense", m.d_model, m.d_model)
        weights.layer_norm(block._attention_norm, f"{prefix}attention.output.LayerNorm", m.d_model)
        weights.dense(block._ffn_inner, f"{prefix}intermediate.dense", m.d_model, m.dff)
        weights.dense(block._ffn_output, f"{prefix}output.dense", m.dff, m.d_model)
        weights.layer_norm(block._ffn_norm, f"{prefix}output.LayerNorm", m.d_model)

    head, fresh = model.get_layer("mlm_head"), []
    init = float(source.config["initializer_range"])
    if any(key.startswith("cls.predictions.") for key in weights.left):
        weights.dense(head._transform, "cls.predictions.transform.dense", m.d_model, m.d_model)
        weights.layer_norm(head._norm, "cls.predictions.transform.LayerNorm", m.d_model)
        bias = weights.take_output_bias(len(order), words)
        weights.assign(head.output_bias, bias[order])
    else:
        _fresh_dense(head._transform, init, seed=1)
        head._norm.gamma.assign(np.ones(m.d_model, np.float32))
        head._norm.beta.assign(np.zeros(m.d_model, np.float32))
        head.output_bias.assign(np.zeros(len(order), np.float32))
        weights.skip(head.weights)
        fresh.append("MLM head (no cls.predictions.* tensors)")
    if any(key.startswith("pooler.") for key in weights.left):
        weights.dense(pooler, "pooler.dense", m.d_model, m.d_model)
    else:
        _fresh_dense(pooler, init, seed=2)
        weights.skip(pooler.weights)
        fresh.append("pooler (no bert.pooler.* tensors)")

    dropped = weights.drop()
    weights.check_complete(model.weights + pooler.weights)
    return model, pooler, {"mapped": weights.used, "dropped": dropped, "fresh": fresh}


def _fresh_dense(layer: keras.layers.Dense, stddev: float, seed: int) -> None:
    """HF's initialisation of a missing Dense (deterministic: the same import gives the same bytes)."""
    rng = np.random.default_rng(seed)
    layer.kernel.assign(rng.normal(0.0, stddev, tuple(layer.kernel.shape)).astype(np.float32))
    layer.bias.assign(np.zeros(tuple(layer.bias.shape), np.float32))


class _Weights:
    """The HF tensors not yet used, and our variables already given a value."""

    def __init__(self, source: Source):
        self.left = dict(source.tensors)
        self.where = source.weights_name
        self.used: list[str] = []
        self._done: set[int] = set()

    def take(self, key: str, shape: tuple) -> np.ndarray:
        if key not in self.left:
            named = key if key.startswith("cls.") else f"bert.{key}"
            raise UserError(f"{self.where}: no tensor {named!r}, which a BERT of config.json's sizes has")
        value = self.left.pop(key)
        if tuple(value.shape) != tuple(shape):
            raise UserError(f"{self.where}: {key} has shape {tuple(value.shape)}, config.json's sizes say "
                            f"{tuple(shape)}")
        self.used.append(key)
        return value

    def assign(self, variable, value: np.ndarray) -> None:
        if tuple(variable.shape) != value.shape:  # a mapping bug, not the user's
            raise AssertionError(f"{variable.path}: shape {tuple(variable.shape)} given {value.shape}")
        variable.assign(value.astype(np.float32))
        self._done.add(id(variable))

    def skip(self, variables) -> None:
        self._done.update(id(v) for v in variables)

    def dense(self, layer: keras.layers.Dense, key: str, units_in: int, units_out: int) -> None:
        """An HF Linear: weight (out, in) is our kernel (in, out) transposed."""
        self.assign(layer.kernel, self.take(f"{key}.weight", (units_out, units_in)).T)
        self.assign(layer.bias, self.take(f"{key}.bias", (units_out,)))

    def layer_norm(self, layer: keras.layers.LayerNormalization, key: str, width: int) -> None:
        self.assign(layer.gamma, self.take(f"{key}.weight", (width,)))
        self.assign(layer.beta, self.take(f"{key}.bias", (width,)))

    def take_output_bias(self, vocab_size: int, words: np.ndarray) -> np.ndarray:
        """cls.predictions.bias (or its tied copy decoder.bias); a saved decoder matrix must be
        the word embeddings: our head is tied."""
        decoder = "cls.predictions.decoder.weight"
        if decoder in self.left:
            matrix = self.take(decoder, (vocab_size, words.shape[1]))
            if not np.array_equal(matrix, words):
                raise UserError(f"{self.where}: {decoder} differs from the word embeddings; an untied MLM output "
                                f"matrix is not supported (trainformer's head is tied)")
        keys = [key for key in ("cls.predictions.bias", "cls.predictions.decoder.bias") if key in self.left]
        if not keys:
            raise UserError(f"{self.where}: no tensor 'cls.predictions.bias', which a BERT MLM head has")
        biases = [self.take(key, (vocab_size,)) for key in keys]
        if len(biases) == 2 and not np.array_equal(*biases):
            raise UserError(f"{self.where}: cls.predictions.bias and cls.predictions.decoder.bias differ")
        return biases[0]

    def drop(self) -> dict[str, str]:
        """Remove what is left out on purpose; anything else left is an error."""
        dropped = {}
        for key in sorted(self.left):
            why = next((why for prefix, why in DROPPED if key.startswith(prefix)), None)
            if why is None:
                raise UserError(f"{self.where}: tensor {key!r} is not used by the BERT import (not a BERT encoder "
                                f"weight, or config.json's sizes do not match the checkpoint)")
            dropped[key] = why
        self.left.clear()
        return dropped

    def check_complete(self, variables) -> None:
        for variable in variables:
            if variable.path.endswith("seed_generator_state"):  # dropout RNG state: not a weight
                continue
            if id(variable) not in self._done:
                raise UserError(f"{self.where}: no tensor was mapped onto {variable.path}: this checkpoint cannot be "
                                f"imported faithfully")


# --- writing the run ------------------------------------------------------------------------

def _check_new_run_dir(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: is a file, not a directory")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        raise UserError(f"--run-dir {run_dir}: exists and is not empty; an import writes a new run: pass a new or "
                        f"empty directory")


def _write_run(run_dir: Path, config: ExperimentConfig, vocab: list[str], lowercase: bool, model: MaskedLM,
               pooler: keras.layers.Dense, manifest: dict) -> str:
    """Write the run into a hidden sibling folder, then rename it to run_dir; returns the
    checkpoint's file prefix relative to checkpoints/."""
    _check_new_run_dir(run_dir)  # again: time has passed
    run_dir = run_dir.absolute()
    staging = run_dir.parent / f".{run_dir.name}.importing-{os.getpid()}"
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # a crashed import of this process id
        run = RunDir(staging)
        run.prepare(config)  # config.yaml
        _write_vocab(run.tokenizer_dir, vocab, lowercase)  # vocab.txt + tokenizer.json, as train writes them
        step = tf.Variable(0, dtype=tf.int64)
        path = Checkpoints(run.checkpoints_dir, 1, model=model, pooler=pooler, step=step).save(0)
        run.write_manifest(manifest)
        _check_new_run_dir(run_dir)
        if run_dir.is_dir():
            run_dir.rmdir()  # empty: checked above
        os.rename(staging, run_dir)  # the checkpoint state file holds relative paths
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"--run-dir {run_dir}: cannot be written ({err.strerror or err})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Path(path).name


def _say_summary(say, source: Source, summary: dict) -> None:
    say(f"imported {source.folder} ({', '.join(source.config.get('architectures') or ['BERT'])}): "
        f"{summary['layers']} layers, d_model {summary['d_model']}, {summary['heads']} heads, dff {summary['dff']}, "
        f"{summary['max_length']} positions, {summary['activation']}, vocab {summary['vocab_size']:,} "
        f"(lowercase {str(summary['lowercase']).lower()}): {summary['num_params']:,} parameters")
    say(f"mapped {len(summary['mapped'])} tensors; token_type_embeddings[0] folded into the position table "
        f"(single-segment input); vocabulary reordered: {' '.join(SPECIAL_TOKENS)} are ids 0-4")
    groups: dict[str, int] = {}
    for key, why in summary["dropped"].items():
        groups[why] = groups.get(why, 0) + 1
    for why, count in groups.items():
        say(f"dropped {count} tensor{'s' if count > 1 else ''}: {why}")
    for what in summary["fresh"]:
        say(f"fresh: {what}")
    for note in summary["notes"]:
        say(f"note: {note}")
    say(f"run directory: {summary['run_dir']}")
    shape = {"init_from": summary["run_dir"], "d_model": summary["d_model"], "num_layers": summary["layers"],
             "num_heads": summary["heads"], "dff": summary["dff"], "norm": "post", "position": "learned",
             "activation": summary["activation"], "max_length": summary["max_length"]}
    say("to start a run from it: trainformer train CONFIG "
        + " ".join(f"--set model.{key}={value}" for key, value in shape.items()))
