"""Export a run as a Hugging Face BERT folder: `trainformer export RUN --format hf --out DIR`.

    config.json               BertConfig: sizes, hidden_act, dropout, id2label / label2id (classify)
    model.safetensors         float32, named as transformers names them: BertForMaskedLM (an mlm
                              run) or BertForSequenceClassification (a classify run)
    vocab.txt                 the run's vocabulary, ids unchanged ([PAD] [UNK] [CLS] [SEP] [MASK] first)
    tokenizer.json            our tokenizer for AutoTokenizer (`tokenizers`): NFKC, then BERT's steps
    tokenizer_config.json     PreTrainedTokenizerFast, do_lower_case = the run's tokenizer.lowercase
    special_tokens_map.json

Every weight goes through bert_mapping.py's Ties, the table `import hf` reads the other way:
importing an export gives back every variable bit for bit (tests/interop/test_hf_export.py).
Refused with one line naming the setting (exit 2): a seq2seq run, `model.norm: pre` (BERT is
post-LN), `model.position: sinusoidal` (BERT learns its positions and does not scale the token
embeddings by sqrt(d_model)), `model.pooling: mean` (BERT's pooler reads [CLS]); those runs
export as saved_model, tflite or onnx.

The folder is written into a hidden sibling and renamed into place when complete, so a crash
never leaves half an export. --out may be new, empty, or an earlier HF export (recognised by
the "exported_by" entry this module writes into model.safetensors' metadata), which is replaced;
anything else is refused (a downloaded bert-base-chinese folder is never overwritten).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

from trainformer.config import ExperimentConfig
from trainformer.data.tokenizer import SETTINGS_FILE, VOCAB_FILE, read_settings
from trainformer.errors import UserError
from trainformer.interop.bert_mapping import (
    CONFIG_KEYS,
    EPSILON,
    HF_ACTIVATIONS,
    TOKEN_TYPE_TABLE,
    TOKEN_TYPES,
    full_name,
    model_ties,
    zero_token_types,
)
from trainformer.model.heads import build_classifier, build_masked_lm
from trainformer.run_dir import RunDir
from trainformer.tasks.classify import LABELS_FILE
from trainformer.tokens import SPECIAL_TOKENS
from trainformer.train.checkpoint import choose_checkpoint

WEIGHTS_FILE = "model.safetensors"
FAST_TOKENIZER_FILE = "tokenizer.json"  # transformers' name (the run's own tokenizer.json is another file)
EXPORTED_BY = "trainformer"  # model.safetensors metadata "exported_by": marks a folder this module wrote
ARCHITECTURES = {"mlm": "BertForMaskedLM", "classify": "BertForSequenceClassification"}
# settings with no BERT equivalent: (config key, its value, why)
UNMAPPABLE = (
    ("norm", "pre", "BERT normalises after each residual (model.norm post)"),
    ("position", "sinusoidal", "BERT learns its positions and does not scale the token embeddings by "
                               "sqrt(d_model) (model.position learned)"),
    ("position", "rope", "BERT adds learned position vectors; it does not rotate queries and keys (model.position learned)"),
    ("pooling", "mean", "BERT's pooler reads the [CLS] vector (model.pooling cls)"),
    ("use_bias", False, "BERT's attention and feed-forward projections add biases (model.use_bias true)"),
    ("glu", True, "BERT's feed-forward is not gated (model.glu false)"),
)
SPECIAL_NAMES = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS))


def export_hf(run_dir: Path, out: Path, which: str | None = None, say=print) -> dict:
    """Write run_dir's latest or best checkpoint (None: the best if the run kept one by valid
    accuracy, train.keep_best, else the latest) into out as a Hugging Face BERT folder;
    returns its config.json. UserError (one line, nothing written) for a run BERT cannot express."""
    run, out = RunDir(Path(run_dir)), Path(out)
    config = run.load_config()
    check_expressible(config, run.config_file)
    settings = read_settings(run.tokenizer_dir)
    if settings["words"]:
        raise UserError(f"export --format hf: {run.tokenizer_dir / SETTINGS_FILE}: a word-aware vocabulary "
                        f"(tokenizer.words) has no Hugging Face BERT tokenizer equivalent (BERT splits Chinese "
                        f"into single characters)")
    _check_out(out)
    vocab = (run.tokenizer_dir / VOCAB_FILE).read_text(encoding="utf-8").splitlines()
    labels = _labels(run) if config.task.type == "classify" else None
    model, checkpoint, step = _restore(run, config, len(vocab), labels, which, say)
    tensors = {full_name(name): value for tie in model_ties(model) for name, value in tie.to_hf().items()}
    tensors[full_name(TOKEN_TYPE_TABLE)] = zero_token_types(config.model.d_model)
    hf_config = bert_config(config, len(vocab), labels)
    provenance = {"exported_by": EXPORTED_BY, "run_dir": str(run.root.resolve()), "checkpoint": checkpoint,
                  "step": str(step)}
    _write_folder(out, lambda folder: _write_files(folder, run, hf_config, tensors, provenance, settings["lowercase"]))
    say(f"exported step {step} of {run.root} as {hf_config['architectures'][0]} ({len(tensors)} tensors, "
        f"float32) to {out}")
    return hf_config


def check_expressible(config: ExperimentConfig, where: Path) -> None:
    """One UserError naming the first setting a Hugging Face BERT cannot express."""
    if config.task.type not in ARCHITECTURES:
        raise UserError(f"export --format hf: {where}: task.type {config.task.type} has no Hugging Face BERT "
                        f"equivalent (an encoder-decoder); only mlm and classify runs export as BERT")
    # any n-gram table is refused (buckets 0: None, which no setting equals)
    unmappable = [*UNMAPPABLE, ("ngram_buckets", config.model.ngram_buckets or None,
                                "BERT's inputs are its tokens alone (model.ngram_buckets 0)")]
    for key, value, why in unmappable:
        if getattr(config.model, key) == value:
            raise UserError(f"export --format hf: {where}: model.{key} {value} has no Hugging Face BERT equivalent "
                            f"({why}); export it as saved_model, tflite or onnx instead")


def bert_config(config: ExperimentConfig, vocab_size: int, labels: list[str] | None) -> dict:
    """config.json of the export: what BertConfig needs to build our model, keys sorted."""
    m = config.model
    hf = {
        "architectures": [ARCHITECTURES[config.task.type]], "model_type": "bert", "vocab_size": vocab_size,
        **{key: getattr(m, ours) for key, ours in CONFIG_KEYS}, "hidden_act": HF_ACTIVATIONS[m.activation],
        "hidden_dropout_prob": m.dropout, "attention_probs_dropout_prob": m.dropout,
        "max_position_embeddings": m.max_length or config.data.seq_len, "type_vocab_size": TOKEN_TYPES,
        "initializer_range": 0.02, "layer_norm_eps": EPSILON, "position_embedding_type": "absolute",
        "pad_token_id": 0, "tie_word_embeddings": True, "is_decoder": False, "add_cross_attention": False,
        "dtype": "float32",
    }
    if labels is not None:
        hf.update(id2label={str(i): label for i, label in enumerate(labels)},
                  label2id={label: i for i, label in enumerate(labels)},
                  problem_type="single_label_classification", classifier_dropout=None)
    return dict(sorted(hf.items()))


def _labels(run: RunDir) -> list[str]:
    path = run.root / LABELS_FILE
    if not path.is_file():
        raise UserError(f"{path}: no such file (a classify run writes its labels there)")
    return json.loads(path.read_text(encoding="utf-8"))


def _restore(run: RunDir, config: ExperimentConfig, vocab_size: int, labels, which: str | None, say):
    """The run's model in float32 with every weight from the checkpoint: (model, path, step)."""
    max_length = config.model.max_length or config.data.seq_len
    if labels is None:
        model = build_masked_lm(config.model, vocab_size, max_length)
    else:
        model = build_classifier(config.model, vocab_size, max_length, len(labels))
    path, description = choose_checkpoint(run.checkpoints_dir, which, config.train.keep_best)
    if description:
        say(f"checkpoint: {description}")
    step = tf.Variable(0, dtype=tf.int64)
    try:  # every weight, or an error: a weight left at its initial value would export silently
        tf.train.Checkpoint(model=model, step=step).restore(path).expect_partial().assert_existing_objects_matched()
    except AssertionError as err:
        raise UserError(f"{path}: does not hold this run's {config.task.type} model "
                        f"({str(err).splitlines()[0][:160]})") from None
    return model, path, int(step.numpy())


def _write_files(folder: Path, run: RunDir, hf_config: dict, tensors: dict, provenance: dict,
                 lowercase: bool) -> None:
    import safetensors.numpy

    # "format": "pt" is what transformers' loader checks for in the metadata
    safetensors.numpy.save_file({k: np.ascontiguousarray(v, np.float32) for k, v in sorted(tensors.items())},
                                str(folder / WEIGHTS_FILE), metadata={"format": "pt", **provenance})
    shutil.copyfile(run.tokenizer_dir / VOCAB_FILE, folder / VOCAB_FILE)
    _fast_tokenizer(folder / VOCAB_FILE, lowercase).save(str(folder / FAST_TOKENIZER_FILE))
    tokenizer = {  # the class that reads tokenizer.json as written; BertTokenizer would rebuild it without NFKC
        "tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": lowercase, "strip_accents": None,
        "tokenize_chinese_chars": True, "model_max_length": hf_config["max_position_embeddings"], **SPECIAL_NAMES,
    }
    for name, content in (("config.json", hf_config), ("tokenizer_config.json", tokenizer),
                          ("special_tokens_map.json", SPECIAL_NAMES)):
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    shutil.copymode(folder / "config.json", folder / WEIGHTS_FILE)  # safetensors writes 0600: the umask's mode


def _fast_tokenizer(vocab_file: Path, lowercase: bool):
    """Our tokenizer as a `tokenizers` pipeline: NFKC first (as ours; HF's BertTokenizer has no
    NFKC, and turns the full-width "，" of Chinese text, "," in our vocabulary, into [UNK]), then
    BERT's lowercasing/accent stripping, CJK and punctuation splitting, and WordPiece."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = vocab_file.read_text(encoding="utf-8").splitlines()
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab)}, unk_token="[UNK]",
                                           max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase),
    ])
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = SPECIAL_NAMES["cls_token"], SPECIAL_NAMES["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, vocab.index(cls)), (sep, vocab.index(sep))])
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def is_hf_export(folder: Path) -> bool:
    """Whether folder is a Hugging Face export this module wrote (its weights say so)."""
    from safetensors import safe_open

    try:
        with safe_open(str(folder / WEIGHTS_FILE), "np") as weights:
            return (weights.metadata() or {}).get("exported_by") == EXPORTED_BY
    except Exception:  # no file, or not a safetensors file: not ours
        return False


def _check_out(out: Path) -> None:
    """OUT may be new, empty, or an earlier HF export (replaced): never anything else."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not is_hf_export(out))):
        raise UserError(f"--out {out}: exists and is not a trainformer Hugging Face export; choose a new or empty "
                        f"directory")


def _write_folder(out: Path, write) -> None:
    """write(folder) into a hidden sibling of out, which then replaces out; an earlier export
    is moved aside first and removed last, so out is always whole."""
    out = out.absolute()
    staging, old = out.with_name(f".{out.name}.hf-partial-{os.getpid()}"), out.with_name(f".{out.name}.hf-old")
    moved_aside = False
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # a crashed export of this process id
        staging.mkdir()
        write(staging)
        _check_out(out)  # again: time has passed
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
            moved_aside = True
        staging.rename(out)
        moved_aside = False
    except OSError as err:
        raise UserError(f"--out {out}: cannot be written ({err.strerror or err})") from None
    finally:
        if moved_aside:
            old.rename(out)  # the new one failed: the earlier export comes back
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
