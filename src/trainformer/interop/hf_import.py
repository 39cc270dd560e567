"""Import a Hugging Face BERT checkpoint folder as a trainformer run directory.

`trainformer import hf HF_DIR --run-dir RUN_DIR` runs `import_hf_bert`. HF_DIR is what
`save_pretrained` writes for a BERT-family model (bert-base-chinese, its fine-tunes, any
BertModel / BertForMaskedLM / BertForPreTraining / BertForSequenceClassification); hf_folder.py
reads and checks it, bert_mapping.py says which tensor is which variable of ours (the export
reads the same table the other way), run_writer.py writes the run, all or nothing.

What the import does, exactly (the parity test proves the result computes what `transformers`
computes, within 1e-4 in float32, on the fixture tests/fixtures/tiny-hf-bert):

- Encoder: BERT is a post-LN encoder with learned positions: our `norm: post`,
  `position: learned`; hidden_act "gelu" becomes `activation: gelu` (exact, erf form),
  "gelu_new"/"gelu_pytorch_tanh" `gelu_tanh`, "relu2" `relu2`. Every tensor goes through bert_mapping's Ties.
- Token types: our encoder has no segment input. Every task here feeds one segment, for which
  BERT adds token_type_embeddings[0] at every position; that row is folded into the learned
  position table, which is exact for single-segment input. Segment pairs cannot be expressed.
- Vocabulary: trainformer needs [PAD] [UNK] [CLS] [SEP] [MASK] as ids 0-4; bert-base-chinese has
  them at 0, 100, 101, 102, 103. The vocabulary is reordered (the five specials first, every
  other token in its original order after them) and the token-embedding rows and the MLM output
  bias are permuted the same way: exact, ids simply change. tokenizer/ holds the reordered
  vocab.txt and tokenizer.json (lowercase = do_lower_case). Our tokenizer applies NFKC before
  WordPiece; HF's BertTokenizer does not, so full-width forms may tokenize differently.
- MLM head: the output matrix is the (tied) token embedding. A checkpoint without
  cls.predictions.* (BertModel, a classification fine-tune) gets a fresh head (kernel ~ N(0,
  initializer_range), zero bias, unit LayerNorm): the summary says so. An untied decoder
  matrix is refused.
- Pooler: bert.pooler.dense is kept for a classifier built later (model/heads.py
  ClassifierHead.pooler); without it the pooler starts fresh like the head.
- Dropped on purpose (listed in the summary): cls.seq_relationship.* (next-sentence head),
  the position_ids / token_type_ids buffers, and classifier.* of a fine-tuned classifier (its
  labels are not known here).
Any other tensor, a missing one, or a shape that does not fit is an error naming the key, and
every variable of our model must receive a tensor (or be one of the fresh ones above), so a
wrong mapping cannot pass silently.

The run directory (run_writer.py): config.yaml, a full ExperimentConfig: task.type mlm,
model.{d_model, num_layers, num_heads, dff, dropout (hidden_dropout_prob), norm post, position
learned, activation, max_length = max_position_embeddings}, data.seq_len min(128, max_length),
tokenizer.{vocab_size, lowercase}; manifest.json: name, num_params, vocab_size, imported_from
{format, source, files with their sha256, architectures, transformers_version,
mapped/dropped/fresh}, created_at, the environment; tokenizer/; checkpoints/ holding exactly

    model    the MaskedLM of config.yaml (model/heads.py build_masked_lm with
             max_length = model.max_length): model.encoder + model's mlm_head
    pooler   a keras.layers.Dense(d_model, activation="tanh", name="pooler"), built on d_model
    step     tf.Variable(0, int64)

so `restore_model(build_masked_lm(...), path)` (trainformer eval) loads it as it is, and an
encoder (+ pooler) for another task is restored with

    tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=classifier.encoder),
                        pooler=classifier.head.pooler).restore(path).expect_partial()

(tests/interop/test_hf_import.py does exactly that and checks the pooled output against transformers').
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np

from trainformer.config import DataConfig, ExperimentConfig, ModelConfig, TaskConfig, TokenizerConfig, validate
from trainformer.data.tokenizer import VOCAB_FILE, Tokenizer
from trainformer.errors import UserError
from trainformer.interop.bert_mapping import (
    CONFIG_KEYS,
    HIDDEN_ACTS,
    OUTPUT_BIAS,
    POSITIONS,
    TOKEN_TYPE_TABLE,
    WORDS,
    Tie,
    encoder_ties,
    fold_token_types,
    full_name,
    mlm_head_ties,
    pooler_ties,
)
from trainformer.interop.hf_folder import Source, read_source
from trainformer.interop.run_writer import check_new_run_dir, write_run
from trainformer.model.heads import MaskedLM, build_masked_lm
from trainformer.run_dir import environment, now
from trainformer.tokens import SPECIAL_TOKENS

SEQ_LEN = 128  # data.seq_len of the imported config (capped at max_position_embeddings)
# Tensors left out on purpose: (prefix, why).
DROPPED = (
    ("cls.seq_relationship.", "next-sentence-prediction head (NSP): no task here uses it"),
    ("classifier.", "classification layer of a fine-tune: its labels are not known here (not imported)"),
    ("embeddings.position_ids", "buffer, not a weight"),
    ("embeddings.token_type_ids", "buffer, not a weight"),
)


def import_hf_bert(hf_dir: Path, run_dir: Path, say=print) -> dict:
    """Convert the Hugging Face BERT checkpoint folder hf_dir into a new run directory run_dir.

    Returns a summary: run_dir, checkpoint, num_params, vocab_size, layers, d_model, heads, dff,
    max_length, activation, lowercase, mapped (HF tensors used), dropped ({key: why}), fresh
    (our weights that start untrained), notes. Raises UserError (one line naming the file and
    key) with nothing written when hf_dir cannot be imported or run_dir is not new or empty.
    """
    hf_dir, run_dir = Path(hf_dir).expanduser(), Path(run_dir).expanduser()
    check_new_run_dir(run_dir)
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
    checkpoint = write_run(run_dir, config, vocab, source.lowercase, model, pooler, _manifest(source, config, summary))
    summary["checkpoint"] = str(run_dir / "checkpoints" / checkpoint)
    _say_summary(say, source, summary)
    return summary


def _manifest(source: Source, config: ExperimentConfig, summary: dict) -> dict:
    return {
        "name": config.name,
        "num_params": summary["num_params"],
        "vocab_size": summary["vocab_size"],
        "imported_from": {
            "format": "huggingface-bert",
            "source": str(source.folder.resolve()),
            "files": source.files,
            "architectures": source.config.get("architectures"),
            "transformers_version": source.config.get("transformers_version"),
            "mapped": len(summary["mapped"]),
            "dropped": summary["dropped"],
            "fresh": summary["fresh"],
        },
        "created_at": now(),
        **environment(),
    }


# --- the trainformer side -------------------------------------------------------------------

def experiment_config(source: Source, name: str) -> ExperimentConfig:
    c = source.config
    max_length = c["max_position_embeddings"]
    config = ExperimentConfig(
        name=name,
        task=TaskConfig(type="mlm"),
        model=ModelConfig(
            **{ours: c[hf] for hf, ours in CONFIG_KEYS}, dropout=float(c["hidden_dropout_prob"]), norm="post",
            position="learned", activation=HIDDEN_ACTS[c["hidden_act"]], max_length=max_length,
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
    init, fresh = float(source.config["initializer_range"]), []
    ties = encoder_ties(model.encoder)
    if weights.has("cls.predictions."):
        weights.resolve_output_bias(len(order), m.d_model)  # before the rows of both are permuted
        ties += mlm_head_ties(model)
    else:
        _fresh_head(model, init)
        weights.skip(model.get_layer("mlm_head").weights)
        fresh.append("MLM head (no cls.predictions.* tensors)")
    if weights.has("pooler."):
        ties += pooler_ties(pooler)
    else:
        _fresh_dense(pooler, init, seed=2)
        weights.skip(pooler.weights)
        fresh.append("pooler (no bert.pooler.* tensors)")
    weights.fold_embeddings(order, source.config["type_vocab_size"], m)
    weights.give(ties)
    dropped = weights.drop()
    weights.check_complete(model.weights + pooler.weights)
    return model, pooler, {"mapped": weights.used, "dropped": dropped, "fresh": fresh}


def _fresh_head(model: MaskedLM, stddev: float) -> None:
    head = model.get_layer("mlm_head")
    _fresh_dense(head._transform, stddev, seed=1)
    head._norm.gamma.assign(np.ones(head._norm.gamma.shape, np.float32))
    head._norm.beta.assign(np.zeros(head._norm.beta.shape, np.float32))
    head.output_bias.assign(np.zeros(head.output_bias.shape, np.float32))


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
        self._again: set[str] = set()  # tensors the import changed and put back: counted once

    def has(self, prefix: str) -> bool:
        return any(key.startswith(prefix) for key in self.left)

    def take(self, key: str, shape: tuple) -> np.ndarray:
        if key not in self.left:
            raise UserError(f"{self.where}: no tensor {full_name(key)!r}, which a BERT of config.json's sizes has")
        value = self.left.pop(key)
        if tuple(value.shape) != tuple(shape):
            raise UserError(f"{self.where}: {key} has shape {tuple(value.shape)}, config.json's sizes say "
                            f"{tuple(shape)}")
        if key in self._again:
            self._again.discard(key)
        else:
            self.used.append(key)
        return value

    def give(self, ties: list[Tie]) -> None:
        """Each Tie's variable gets its HF tensor(s)."""
        for tie in ties:
            value = tie.from_hf([self.take(name, shape) for name, shape in zip(tie.names, tie.hf_shapes())])
            if tuple(tie.variable.shape) != value.shape:  # a mapping bug, not the user's
                raise AssertionError(f"{tie.variable.path}: shape {tuple(tie.variable.shape)} given {value.shape}")
            tie.variable.assign(value)
            self._done.add(id(tie.variable))

    def skip(self, variables) -> None:
        self._done.update(id(v) for v in variables)

    def fold_embeddings(self, order: np.ndarray, type_vocab: int, m: ModelConfig) -> None:
        """Our ids (specials first: rows permuted by `order`) and token type 0 in the positions,
        left for `give` under the HF names."""
        self._put(WORDS, self.take(WORDS, (len(order), m.d_model))[order])
        positions = self.take(POSITIONS, (m.max_length, m.d_model))
        if type_vocab:
            positions = fold_token_types(positions, self.take(TOKEN_TYPE_TABLE, (type_vocab, m.d_model)))
        self._put(POSITIONS, positions)
        if OUTPUT_BIAS in self.left:
            self.left[OUTPUT_BIAS] = self.left[OUTPUT_BIAS][order]

    def _put(self, key: str, value: np.ndarray) -> None:
        """Put back a tensor the import changed, for `give` (counted once in `used`)."""
        self.left[key] = value
        self._again.add(key)

    def resolve_output_bias(self, vocab_size: int, d_model: int) -> None:
        """cls.predictions.bias (or its tied copy decoder.bias) left as cls.predictions.bias; a
        saved decoder matrix must be the word embeddings: our head is tied."""
        decoder = "cls.predictions.decoder.weight"
        if decoder in self.left:
            matrix = self.take(decoder, (vocab_size, d_model))
            if not np.array_equal(matrix, self.left.get(WORDS)):
                raise UserError(f"{self.where}: {decoder} differs from the word embeddings; an untied MLM output "
                                f"matrix is not supported (trainformer's head is tied)")
        keys = [key for key in (OUTPUT_BIAS, "cls.predictions.decoder.bias") if key in self.left]
        if not keys:
            raise UserError(f"{self.where}: no tensor 'cls.predictions.bias', which a BERT MLM head has")
        biases = [self.take(key, (vocab_size,)) for key in keys]
        if len(biases) == 2 and not np.array_equal(*biases):
            raise UserError(f"{self.where}: cls.predictions.bias and cls.predictions.decoder.bias differ")
        self._put(OUTPUT_BIAS, biases[0])


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
    # the encoder's sizes are in the run's config.yaml: a run started from it takes them there
    say(f"to start a run from it: trainformer train CONFIG --set model.init_from={summary['run_dir']}")
