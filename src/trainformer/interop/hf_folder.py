"""Reading a Hugging Face BERT folder (what `save_pretrained` writes) and checking that it is
a BERT trainformer can hold.

    config.json             model_type "bert"; sizes, hidden_act, layer_norm_eps, ...
    model.safetensors       the weights (or model.safetensors.index.json + shards); float32,
                            float16 or bfloat16, read as float32. pytorch_model.bin is not read
                            (a pickle can run code): the error says how to convert it.
    vocab.txt               the WordPiece vocabulary
    tokenizer_config.json   optional: do_lower_case (BERT's default: true)

`read_source` reads and checks everything before anything is converted: an unsupported
config (another model_type, activation, epsilon, relative positions, a decoder) or a broken
file is one UserError naming the file and the key.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainformer.data.tokenizer import VOCAB_FILE
from trainformer.errors import UserError
from trainformer.files import read_json
from trainformer.interop.bert_mapping import EPSILON, HIDDEN_ACTS
from trainformer.tokens import SPECIAL_TOKENS

SUPPORTED_MODEL_TYPES = ("bert",)
# BertConfig's defaults: a config.json may leave out what equals them.
BERT_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "initializer_range": 0.02, "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
    "is_decoder": False, "add_cross_attention": False,
}
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
