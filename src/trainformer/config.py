"""Typed configuration of one experiment: dataclasses, YAML load/dump, `--set a.b=c` overrides.

Every key has a type and a default here; a YAML file or an override may only name keys
that exist (a typo gets a "did you mean" suggestion) and values are checked on load, so a
bad config fails in the first second with one line, not an hour into training.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainformer.errors import UserError

DEFAULT_CONFIG = "zh-bert-tiny"
MAX_NGRAM_BUCKETS = 2**17  # model.ngram_buckets: NgramEmbedding's hash stays inside int32


class ConfigError(UserError):
    """A config file or override names an unknown key or holds an impossible value."""


# The defaults of every key are the default job's (built-in zh-bert-tiny, README's table): a
# YAML file that leaves a key out gets what the README says. `base: NAME` starts a file from
# another built-in (or YAML file) instead.


@dataclass
class ModelConfig:
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 2
    dff: int = 512
    dropout: float = 0.0
    norm: str = "pre"  # post: LayerNorm after each residual (BERT, the seeds); pre: before
    position: str = "sinusoidal"  # sinusoidal | learned | rope (rotary: no position vectors; queries and keys turned by position; a seq2seq decoder's are sinusoidal)
    activation: str = "gelu_tanh"  # feed-forward: gelu_tanh (approximate) | gelu (exact, erf: BERT's) | relu2 (relu squared)
    max_length: int = 0  # positions the model holds; 0: data.seq_len (an imported BERT keeps its 512)
    # hash buckets of the character bigrams and trigrams added to each token's vector (ZEN,
    # Diao et al. 2020); 0: none (BERT's inputs)
    ngram_buckets: int = 0
    # whether the blocks' attention and feed-forward projections add a bias (BERT's do; Cramming,
    # Geiping & Goldstein 2022, drops them: fewer element-wise passes per step)
    use_bias: bool = True
    # whether the blocks' feed-forward is gated: activation(x W_gate) * (x W_inner) (Shazeer 2020,
    # "GLU Variants Improve Transformer"; ModernBERT's GeGLU): three projections of dff, so 2/3
    # of a plain one's dff keeps the parameters
    glu: bool = False
    # A run directory whose encoder (weights and vocabulary) this run starts from; the encoder
    # keys above that a config leaves out (all but dropout) are taken from its config.yaml.
    init_from: str = ""
    decoder_layers: int = 0  # seq2seq: decoder blocks; 0: num_layers
    # seq2seq with init_from: encoder: the decoder's blocks start from the encoder's of the same
    # index (BERT2BERT, Rothe et al. 2020), cross-attention from random; random: all from random.
    decoder_init: str = "encoder"
    tie_embeddings: bool = True  # seq2seq: one embedding for source, target and output (a joint vocabulary)
    # seq2seq: the decoder may copy a source token as well as generate one (pointer-generator,
    # See et al. 2017): what a summary that reuses its article's words needs
    copy_source: bool = False
    # classify: what the head's pooler reads: cls (the [CLS] vector, BERT's) | mean (the mean of
    # every non-padding position's vector: no single position has to learn the summary)
    pooling: str = "cls"
    generator_layers: int = 0  # electra: the generator's blocks (the encoder's width); 0: num_layers // 3, at least 1


@dataclass
class DataConfig:
    corpus: str = "people-daily-1998"  # a recipe (trainformer data list), a .txt/.jsonl path; mlm: a+b+...
    seq_len: int = 64  # tokens per window (mlm), per text (classify), per source (seq2seq)
    target_len: int = 0  # seq2seq: tokens per target, its end token included; 0: seq_len
    valid_fraction: float = 0.05
    test_fraction: float = 0.0  # a labelled set's share held out for the final test score (never trained on)
    mask_rate: float = 0.15
    # mlm, electra: training's masking rate falls linearly from mask_rate + mask_spread at the
    # first step to mask_rate - mask_spread at the last (Ankner et al. 2024); held-out cloze masks
    # mask_rate, so its figures compare; 0: mask_rate throughout
    mask_spread: float = 0.0
    mask_span: int = 1  # mlm, electra: training masks runs of this many tokens (held-out cloze: single ones)
    # mlm, electra: the last long_fraction of the steps read windows of long_seq_len tokens, fewer
    # per batch so a step keeps its tokens (BERT: 90% of its steps at 128, then 512): short windows
    # leave the unigram plateau sooner, long ones train the positions a fine-tune reads; 0: off
    long_seq_len: int = 0
    long_fraction: float = 0.1
    # mlm, electra on a labelled corpus: tokens whose frequency differs between the labels are
    # masked more often, with weight 1 + this x their log-frequency spread (data/selective.py,
    # Gu et al. 2020); 0: uniform
    selective_masking: float = 0.0
    # mlm, electra: each epoch cuts the packed stream at new window boundaries (a random offset),
    # so a document split between two windows in one epoch is read whole in another; false: the
    # same windows every epoch (data/pipeline.py, shifted_windows)
    shift_windows: bool = False
    # mlm, electra: how training windows are cut from the token stream: stream (one stream, cut
    # every seq_len-1 tokens: a document may start anywhere and end in the next window) |
    # documents (each window starts at a document's start and holds whole documents; a longer
    # one is cut into window-sized pieces: data/pipeline.py, pack_documents); held-out cloze
    # reads stream windows either way, so its figures compare
    packing: str = "stream"
    # mlm, electra: training masks whole words (jieba's segmentation), every character of a word
    # at once, so a word is guessed from its sentence, not from its other characters
    # (data/whole_words.py, Cui et al. 2019); held-out cloze still masks single tokens
    whole_words: bool = False
    # classify: each training batch hides this share of its texts' tokens behind [MASK], a fresh
    # draw per batch (token cutoff, Shen et al. 2020); eval and predict read whole texts; 0: off
    input_mask_rate: float = 0.0


@dataclass
class TokenizerConfig:
    vocab_size: int = 8000
    min_frequency: int = 2
    lowercase: bool = True
    # word-aware (WoBERT's idea): a run of Chinese characters is one word, split into learned
    # multi-character pieces ("手机", "不错") instead of one token per character: 0.68x the tokens
    words: bool = False
    vocab_file: str = ""  # an existing vocab.txt to use instead of training one


@dataclass
class TrainConfig:
    steps: int = 4000  # optimizer updates
    # a wall-clock budget instead (Cramming's): > 0 times this machine's step when a new run
    # starts and sets steps to what fits in these minutes, written into the run's config.yaml
    # (evaluations and checkpoints come on top); a resumed run keeps the steps it set
    minutes: float = 0.0
    batch_size: int = 32  # windows (mlm) or texts (classify) per micro-batch; seq2seq uses batch_tokens
    batch_tokens: int = 4096  # seq2seq: padded source + target tokens per micro-batch (rows vary with length)
    label_smoothing: float = 0.0  # seq2seq, classify: share of each training target's probability spread over every token or label
    # electra: the replaced-token loss's weight beside the generator's (ELECTRA's 50). The two share
    # the token embedding. At 50 the tenth pass' generator stayed on the unigram plateau (1 left it);
    # on today's recipe (triangle, rotary positions) it leaves it at 50 too. Either way the
    # discriminator stayed within ~0.7 points of answering "original" everywhere in our CPU minutes
    # (benchmarks/classify/README.md, "tenth pass", "forty-third pass")
    discriminator_weight: float = 50.0
    accumulate: int = 1  # micro-batches per update: one update sees accumulate x batch_size windows
    learning_rate: float = 1e-3
    warmup_steps: int = 200  # capped at `steps` for a shorter run
    # linear: up to learning_rate over warmup_steps, then linearly to 0 at steps (BERT's);
    # triangle: from a quarter of learning_rate up to it at 75% of the steps, then linearly to 0
    # (Cramming's one-cycle, Geiping & Goldstein 2022; it has no warmup_steps)
    schedule: str = "linear"
    weight_decay: float = 0.01
    # classify: layer-wise learning-rate decay (Clark et al. 2020): the head learns at the full rate,
    # the top encoder block at x decay, the next at x decay^2, ..., the embeddings at
    # x decay^(num_layers + 1), so the pretrained lower layers move least; 1.0: off
    layer_decay: float = 1.0
    # with model.init_from: NoisyTune (Wu et al. 2022): before the first step each of the encoder's
    # weight tensors gets uniform noise of width this x its standard deviation, against the
    # pretrained weights' overfitting to their pretraining (the paper's 0.15); 0: off
    noisy_tune: float = 0.0
    clip_norm: float = 1.0
    # an exponential moving average of the weights, with this decay per step (Polyak averaging;
    # 0.99 averages over the last ~100 updates), is what evaluations and checkpoints/best read;
    # training steps from the weights themselves, and the latest checkpoints hold both; 0: off
    ema: float = 0.0
    # classify: run directories (comma-separated) of classifiers fine-tuned on the same split, the
    # teachers: the loss is the cross-entropy against the mean of their probabilities for each
    # training text instead of its label (knowledge distillation, Hinton et al. 2015), computed
    # once from the checkpoint eval scores in each and kept in the run's cache; "": the labels
    distill_from: str = ""
    # classify: R-Drop (Liang et al. 2021): each training text passes twice, under two dropout
    # draws, and the loss adds this weight times the symmetric KL divergence of the two
    # predictions, so the head cannot lean on any one draw; twice the step's work; 0: off
    rdrop: float = 0.0
    precision: str = "auto"  # auto (bf16 where the hardware runs it fast, else fp32) | fp32 | bf16 | fp16 (mixed: fp32 variables, softmax and loss; fp16 with loss scaling)
    xla: str = "auto"  # auto (on for GPU; on CPU only the optimizer's update, where the whole step measured slower) | on | off
    seed: int = 42
    deterministic: bool = False  # op determinism: same config + same vocabulary -> bitwise-equal weights
    strategy: str = "auto"  # auto (mirrored if >1 GPU, multi_worker if TF_CONFIG names workers) | one_device | mirrored | multi_worker | tpu
    on_nan: str = "stop"  # non-finite gradients outside fp16: stop | rollback (last checkpoint, skip the batches since)
    log_every: int = 100
    eval_every: int = 500
    attention_layer: int = -1  # which layer's heads TensorBoard draws at each eval; negative counts from the end
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    # checkpoints/best/ holds the eval with the best valid accuracy (the task's: accuracy,
    # masked_accuracy, ...) instead of the lowest valid loss, and eval, predict and export use it
    # by default; the test split never chooses. false: best/ by valid loss, `latest` by default
    keep_best: bool = False


@dataclass
class RuntimeConfig:
    memory_growth: bool = True  # GPUs take memory as needed instead of reserving all of it at start
    cpu_devices: int = 1  # split the CPU into N logical devices: try multi-device strategies without GPUs


@dataclass
class TaskConfig:
    type: str = "mlm"  # mlm (masked-LM pretraining) | electra (replaced-token detection) | classify (text -> label) | seq2seq (text -> text)


@dataclass
class DecodeConfig:
    """seq2seq: how outputs are generated, in eval, predict and a served model."""

    strategy: str = "beam"  # greedy | beam
    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT's alpha: scores are log p / ((5 + length) / 6) ** alpha
    max_length: int = 0  # output tokens at most; 0: data.target_len


@dataclass
class ExperimentConfig:
    name: str = DEFAULT_CONFIG
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def dump(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True))


CHOICES = {
    "task.type": ("mlm", "electra", "classify", "seq2seq"),
    "decode.strategy": ("greedy", "beam"),
    "model.norm": ("post", "pre"),
    "model.activation": ("gelu_tanh", "gelu", "relu2"),
    "model.position": ("sinusoidal", "learned", "rope"),
    "model.pooling": ("cls", "mean"),
    "model.decoder_init": ("encoder", "random"),
    "train.precision": ("auto", "fp32", "bf16", "fp16"),
    "train.xla": ("auto", "on", "off"),
    "train.strategy": ("auto", "one_device", "mirrored", "multi_worker", "tpu"),
    "train.on_nan": ("stop", "rollback"),
    "train.schedule": ("linear", "triangle"),
    "data.packing": ("stream", "documents"),
}


def builtin_names() -> list[str]:
    folder = importlib.resources.files("trainformer") / "configs"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_config(source: str | None = None, overrides: list[str] = ()) -> ExperimentConfig:
    """Resolve a config from a YAML path or a built-in name (None: the default), then apply
    `key=value` overrides. Raises ConfigError naming the file, key and problem."""
    return load_config_naming(source, overrides)[0]


def load_config_naming(source: str | None = None,
                       overrides: list[str] = ()) -> tuple[ExperimentConfig, frozenset[str]]:
    """load_config, and the dotted keys (model.d_model, ...) the config names itself: in the
    YAML file given or the bases it starts from, or by --set. The other keys hold the
    dataclasses' defaults, which a run starting from another (model.init_from) takes from that
    run for its encoder. Without a source nothing is named by a file: the built-in default only
    spells out the dataclasses' defaults."""
    for item in overrides:  # first: `--set train.steps 50` leaves "50" where CONFIG goes
        _split_override(item)
    config, origin, named = _load_source(source or DEFAULT_CONFIG, seen=())
    for item in overrides:
        apply_override(config, item)
    given = {_split_override(item)[0] for item in overrides}
    if "train.steps" in given and "train.minutes" not in given:
        config.train.minutes = 0.0  # a step count asked for on the command line beats a file's budget
    validate(config, origin + (" with --set" if overrides else ""))
    return config, frozenset(given | (named if source is not None else set()))


def _load_source(source: str, seen: tuple[str, ...]) -> tuple[ExperimentConfig, str, set[str]]:
    """The config of a YAML file or built-in, its `base:` applied first (unvalidated); its
    origin; the dotted keys it and its bases name."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"{source}: config file not found")
        text, origin, name, identity = path.read_text(encoding="utf-8"), str(path), path.stem, str(path.resolve())
    elif source in builtin_names():
        resource = importlib.resources.files("trainformer") / "configs" / f"{source}.yaml"
        text, origin, name, identity = resource.read_text(encoding="utf-8"), f"built-in {source}", source, source
    else:
        raise ConfigError(
            f"{source}: no such config file or built-in config (built-ins: {', '.join(builtin_names())})"
        )
    if identity in seen:
        raise ConfigError(f"{origin}: base: the chain of bases comes back to this config")
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{origin}{where}: not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections (model:, data:, ...)")
    raw.setdefault("name", name)
    base = raw.pop("base", None)
    named = _dotted_keys(raw)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{origin}: base: expected a built-in name or a YAML path, got {base!r}")
        if path.is_file() and (path.parent / base).is_file():
            base = str(path.parent / base)  # a base file next to this one
        below, _, base_named = _load_source(base, seen + (identity,))
        raw, named = _merge(below.to_dict(), raw), named | base_named
    return _build(ExperimentConfig, raw, origin, prefix=""), origin, named


def _dotted_keys(raw: dict, prefix: str = "") -> set[str]:
    """The leaf keys of a raw YAML mapping, dotted: {"model": {"d_model": 8}} -> {"model.d_model"}."""
    keys = set()
    for key, value in raw.items():
        keys |= _dotted_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return keys


def _merge(base: dict, top: dict) -> dict:
    """base with top's keys on top, section by section."""
    merged = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merge(base[key], value) if both else value
    return merged


def _split_override(item: str) -> tuple[str, str]:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item}: expected key=value with '=', e.g. --set train.steps=200")
    return key.strip(), text.strip()


def apply_override(config: ExperimentConfig, item: str) -> None:
    """Apply one `a.b=value` override, parsing the value by the key's declared type."""
    key, text = _split_override(item)
    *sections, leaf = key.split(".")
    target = config
    for depth, section in enumerate(sections):
        if not dataclasses.is_dataclass(target):
            raise ConfigError(f"--set {key}: {'.'.join(sections[:depth])} is a value, not a section")
        target = getattr(target, _known_key(target, section, ".".join(sections[:depth]), "--set"))
    if not dataclasses.is_dataclass(target):
        raise ConfigError(f"--set {key}: {'.'.join(sections)} is a value, not a section")
    leaf = _known_key(target, leaf, ".".join(sections), "--set")
    kind = _field_types(type(target))[leaf]
    if dataclasses.is_dataclass(kind):
        raise ConfigError(f"--set {key}: {key} is a section; set one of its keys, e.g. {key}.{dataclasses.fields(kind)[0].name}")
    setattr(target, leaf, _parse(text, kind, f"--set {key}"))


def validate(config: ExperimentConfig, origin: str) -> None:
    """Reject values no run could use, naming the key."""
    m, d, t, tok = config.model, config.data, config.train, config.tokenizer
    for key, allowed in CHOICES.items():
        section, leaf = key.split(".")
        value = getattr(getattr(config, section), leaf)
        if value not in allowed:
            raise ConfigError(f"{origin}: {key}: {value!r} is not one of {', '.join(allowed)}")
    positive = {
        "model.d_model": m.d_model, "model.num_layers": m.num_layers, "model.num_heads": m.num_heads,
        "model.dff": m.dff, "tokenizer.vocab_size": tok.vocab_size, "train.steps": t.steps,
        "train.batch_size": t.batch_size, "train.accumulate": t.accumulate, "train.learning_rate": t.learning_rate,
        "train.log_every": t.log_every, "train.eval_every": t.eval_every,
        "train.checkpoint_every": t.checkpoint_every, "train.keep_checkpoints": t.keep_checkpoints,
        "tokenizer.min_frequency": tok.min_frequency, "runtime.cpu_devices": config.runtime.cpu_devices,
        "train.batch_tokens": t.batch_tokens, "decode.beam_size": config.decode.beam_size,
        "data.mask_span": d.mask_span,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{origin}: {key}: must be > 0, got {value}")
    if m.d_model % m.num_heads:
        raise ConfigError(
            f"{origin}: model.d_model: {m.d_model} is not divisible by model.num_heads ({m.num_heads})"
        )
    if m.position == "sinusoidal" and m.d_model % 2:
        raise ConfigError(f"{origin}: model.d_model: sinusoidal positions need an even size, got {m.d_model}")
    ranges = {
        "model.dropout": (m.dropout, 0.0, 1.0), "data.valid_fraction": (d.valid_fraction, 0.0, 1.0),
        "data.mask_rate": (d.mask_rate, 0.0, 1.0), "data.test_fraction": (d.test_fraction, 0.0, 1.0),
        "train.label_smoothing": (t.label_smoothing, 0.0, 1.0), "data.input_mask_rate": (d.input_mask_rate, 0.0, 1.0),
        "train.ema": (t.ema, 0.0, 1.0),
    }
    may_be_zero = ("model.dropout", "data.test_fraction", "train.label_smoothing", "data.input_mask_rate", "train.ema")
    for key, (value, low, high) in ranges.items():
        if not low <= value < high or (key not in may_be_zero and value == 0):
            raise ConfigError(f"{origin}: {key}: must be in ({low}, {high}), got {value}")
    if d.valid_fraction + d.test_fraction >= 1:
        raise ConfigError(f"{origin}: data.test_fraction: with data.valid_fraction it must leave data to train on, "
                          f"got {d.valid_fraction} + {d.test_fraction}")
    if m.max_length and m.max_length < d.seq_len:
        raise ConfigError(f"{origin}: model.max_length: {m.max_length} positions cannot hold data.seq_len={d.seq_len}")
    if not 0 <= m.ngram_buckets <= MAX_NGRAM_BUCKETS:
        raise ConfigError(f"{origin}: model.ngram_buckets: must be in [0, {MAX_NGRAM_BUCKETS}] "
                          f"(0: no n-grams), got {m.ngram_buckets}")
    if m.max_length < 0:
        raise ConfigError(f"{origin}: model.max_length: must be >= 0 (0: data.seq_len), got {m.max_length}")
    if t.noisy_tune < 0:
        raise ConfigError(f"{origin}: train.noisy_tune: must be >= 0 (0: off), got {t.noisy_tune}")
    if t.noisy_tune and not m.init_from:
        raise ConfigError(f"{origin}: train.noisy_tune: perturbs the weights a run starts from, and model.init_from "
                          f"is empty (set it, or train.noisy_tune=0)")
    if t.discriminator_weight < 0:
        raise ConfigError(f"{origin}: train.discriminator_weight: must be >= 0, got {t.discriminator_weight}")
    for key, value in {"model.decoder_layers": m.decoder_layers, "model.generator_layers": m.generator_layers,
                       "data.target_len": d.target_len,
                       "decode.max_length": config.decode.max_length}.items():
        if value < 0:
            raise ConfigError(f"{origin}: {key}: must be >= 0 (0: the default), got {value}")
    if config.decode.max_length > (d.target_len or d.seq_len):
        raise ConfigError(f"{origin}: decode.max_length: {config.decode.max_length} is more than the decoder's "
                          f"{d.target_len or d.seq_len} positions (data.target_len)")
    if config.decode.length_penalty < 0:
        raise ConfigError(f"{origin}: decode.length_penalty: must be >= 0, got {config.decode.length_penalty}")
    if d.seq_len < 8:
        raise ConfigError(f"{origin}: data.seq_len: must be >= 8, got {d.seq_len}")
    if t.minutes < 0:
        raise ConfigError(f"{origin}: train.minutes: must be >= 0 (0: train.steps as given), got {t.minutes}")
    if t.warmup_steps < 0:  # more than train.steps is capped at train.steps (a short trial run)
        raise ConfigError(f"{origin}: train.warmup_steps: must be >= 0, got {t.warmup_steps}")
    if not -m.num_layers <= t.attention_layer < m.num_layers:
        raise ConfigError(f"{origin}: train.attention_layer: must be within [-{m.num_layers}, {m.num_layers - 1}] "
                          f"(model.num_layers={m.num_layers}), got {t.attention_layer}")
    _validate_classify_only(config, origin)
    _validate_long_windows(config, origin)
    if d.selective_masking < 0:
        raise ConfigError(f"{origin}: data.selective_masking: must be >= 0 (0: uniform masking), got "
                          f"{d.selective_masking}")
    if d.selective_masking and config.task.type not in ("mlm", "electra"):
        raise ConfigError(f"{origin}: data.selective_masking: chooses the tokens a masked-LM run masks; a "
                          f"{config.task.type} run masks none (leave it at 0)")
    if d.shift_windows and config.task.type not in ("mlm", "electra"):
        raise ConfigError(f"{origin}: data.shift_windows: cuts a masked-LM run's packed windows; a "
                          f"{config.task.type} run reads whole texts (leave it false)")
    _validate_whole_words(config, origin)
    _validate_packing(config, origin)
    _validate_mask_spread(config, origin)
    if tok.vocab_size < 100:
        raise ConfigError(f"{origin}: tokenizer.vocab_size: must be >= 100, got {tok.vocab_size}")


def _validate_mask_spread(config: ExperimentConfig, origin: str) -> None:
    d = config.data
    if not d.mask_spread:
        return
    if config.task.type not in ("mlm", "electra"):
        raise ConfigError(f"{origin}: data.mask_spread: schedules a masked-LM run's masking rate; a "
                          f"{config.task.type} run masks none (leave it at 0)")
    if not 0 < d.mask_spread < d.mask_rate or d.mask_rate + d.mask_spread >= 1:
        raise ConfigError(f"{origin}: data.mask_spread: the rate falls from data.mask_rate + spread to data.mask_rate "
                          f"- spread, both in (0, 1); with data.mask_rate={d.mask_rate} the spread must be in "
                          f"(0, {min(d.mask_rate, 1 - d.mask_rate):g}), got {d.mask_spread}")


def _validate_whole_words(config: ExperimentConfig, origin: str) -> None:
    d = config.data
    if not d.whole_words:
        return
    if config.task.type not in ("mlm", "electra"):
        raise ConfigError(f"{origin}: data.whole_words: chooses the tokens a masked-LM run masks; a "
                          f"{config.task.type} run masks none (leave it false)")
    others = {"data.mask_span": d.mask_span > 1, "data.selective_masking": d.selective_masking > 0,
              "data.shift_windows": d.shift_windows, "tokenizer.words": config.tokenizer.words}
    for key, on in others.items():
        if on:
            raise ConfigError(f"{origin}: data.whole_words: not with {key} (choose one)")


def _validate_packing(config: ExperimentConfig, origin: str) -> None:
    d = config.data
    if d.packing == "stream":
        return
    if config.task.type not in ("mlm", "electra"):
        raise ConfigError(f"{origin}: data.packing: cuts a masked-LM run's windows; a {config.task.type} run "
                          f"reads whole texts (leave it stream)")
    for key, on in {"data.shift_windows": d.shift_windows, "data.whole_words": d.whole_words}.items():
        if on:  # both read the windows as one stream cut every seq_len-1 tokens
            raise ConfigError(f"{origin}: data.packing: documents is not with {key} (choose one)")


def _validate_long_windows(config: ExperimentConfig, origin: str) -> None:
    d, t, long = config.data, config.train, config.data.long_seq_len
    if long < 0:
        raise ConfigError(f"{origin}: data.long_seq_len: must be >= 0 (0: off), got {long}")
    if not long:
        return
    if config.task.type not in ("mlm", "electra"):
        raise ConfigError(f"{origin}: data.long_seq_len: pretraining windows (task.type mlm or electra); "
                          f"a {config.task.type} run reads data.seq_len only")
    if long <= d.seq_len:
        raise ConfigError(f"{origin}: data.long_seq_len: {long} must be more than data.seq_len={d.seq_len}")
    if t.batch_size * d.seq_len % long:
        raise ConfigError(f"{origin}: data.long_seq_len: {long} tokens do not divide a batch of train.batch_size x "
                          f"data.seq_len = {t.batch_size * d.seq_len} tokens (long windows keep a step's tokens)")
    if not 0 < d.long_fraction < 1:
        raise ConfigError(f"{origin}: data.long_fraction: must be in (0, 1), got {d.long_fraction}")
    if config.model.max_length and config.model.max_length < long:
        raise ConfigError(f"{origin}: model.max_length: {config.model.max_length} positions cannot hold "
                          f"data.long_seq_len={long}")


def long_windows(config: ExperimentConfig) -> tuple[int, int] | None:
    """data.long_seq_len's windows: (the number of their first batch, windows per batch); None: off."""
    d, t = config.data, config.train
    if not d.long_seq_len:
        return None
    first_step = round(t.steps * (1 - d.long_fraction))
    return first_step * t.accumulate, t.batch_size * d.seq_len // d.long_seq_len


def teachers(config: ExperimentConfig) -> list[str]:
    """train.distill_from's run directories, in the order given."""
    return [part.strip() for part in config.train.distill_from.split(",") if part.strip()]


def _validate_classify_only(config: ExperimentConfig, origin: str) -> None:
    """Fine-tuning keys that only a classifier (label_smoothing: or a decoder) has a use for:
    elsewhere they would do nothing (or, for layer_decay on a model without its encoder-and-head
    layout, the wrong thing)."""
    t = config.train
    if not 0 < t.layer_decay <= 1:
        raise ConfigError(f"{origin}: train.layer_decay: must be in (0, 1] (1.0: off), got {t.layer_decay}")
    kind = config.task.type
    if t.layer_decay != 1 and kind != "classify":
        raise ConfigError(f"{origin}: train.layer_decay: fine-tunes a classifier's encoder; a {kind} run has "
                          f"none to fine-tune (leave it at 1.0)")
    if config.model.pooling != "cls" and kind != "classify":
        raise ConfigError(f"{origin}: model.pooling: {config.model.pooling} pools for a classifier's head; a "
                          f"{kind} run has none (leave it at cls)")
    if t.distill_from and kind != "classify":
        raise ConfigError(f"{origin}: train.distill_from: teaches a classifier from others' probabilities; a "
                          f"{kind} run has no labels to replace (leave it empty)")
    if t.label_smoothing and kind in ("mlm", "electra"):
        raise ConfigError(f"{origin}: train.label_smoothing: softens a classifier's or a decoder's targets; a {kind} "
                          f"run's are not smoothed (leave it at 0)")
    if t.label_smoothing and t.distill_from:
        raise ConfigError(f"{origin}: train.label_smoothing: the labels it would soften are replaced by the "
                          f"teachers' probabilities under train.distill_from (leave one of them at 0 / empty)")
    if t.rdrop < 0:
        raise ConfigError(f"{origin}: train.rdrop: must be >= 0 (0: off), got {t.rdrop}")
    if t.rdrop and kind != "classify":
        raise ConfigError(f"{origin}: train.rdrop: compares a classifier's two predictions of each text; a "
                          f"{kind} run has none (leave it at 0)")
    if t.rdrop and not config.model.dropout:
        raise ConfigError(f"{origin}: train.rdrop: compares two dropout draws, and model.dropout is 0: the two "
                          f"predictions would be the same (set model.dropout, e.g. 0.1, or train.rdrop=0)")
    if config.data.input_mask_rate and kind != "classify":
        raise ConfigError(f"{origin}: data.input_mask_rate: hides a classifier's input tokens; a {kind} run "
                          f"masks by data.mask_rate (leave it at 0)")


def _build(cls: type, raw: Any, origin: str, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: {prefix.rstrip('.') or 'top level'}: expected a mapping, got {raw!r}")
    types = _field_types(cls)
    values = {}
    for key, value in raw.items():
        key = _known_key(cls, str(key), prefix.rstrip("."), origin)
        kind = types[key]
        if dataclasses.is_dataclass(kind):
            values[key] = _build(kind, value, origin, f"{prefix}{key}.")
        else:
            values[key] = _check_type(value, kind, f"{origin}: {prefix}{key}")
    return cls(**values)


def _field_types(cls: type) -> dict[str, type]:
    hints = {"int": int, "float": float, "str": str, "bool": bool}
    nested = {
        "TaskConfig": TaskConfig, "ModelConfig": ModelConfig, "DataConfig": DataConfig,
        "TokenizerConfig": TokenizerConfig, "TrainConfig": TrainConfig, "RuntimeConfig": RuntimeConfig,
        "DecodeConfig": DecodeConfig,
    }
    return {f.name: hints.get(f.type) or nested[f.type] for f in dataclasses.fields(cls)}


def _known_key(target: Any, key: str, section: str, origin: str) -> str:
    cls = target if isinstance(target, type) else type(target)
    names = [f.name for f in dataclasses.fields(cls)]
    if key in names:
        return key
    full = f"{section}.{key}" if section else key
    candidates = [f"{section}.{n}" if section else n for n in names]
    close = difflib.get_close_matches(full, candidates, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else f" (valid: {', '.join(candidates)})"
    raise ConfigError(f"{origin}: unknown key '{full}'{hint}")


def _check_type(value: Any, kind: type, where: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
        return _parse(value, float, where)
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value


def _parse(text: str, kind: type, where: str) -> Any:
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return lowered in ("true", "1", "yes")
        if kind is int:
            return int(text)
        return kind(text)
    except ValueError:
        raise ConfigError(f"{where}: expected {kind.__name__}, got {text!r}") from None


DECODE_KEYS = "decode.strategy, decode.beam_size, decode.length_penalty, decode.max_length"


def with_decode_overrides(config: ExperimentConfig, overrides) -> ExperimentConfig:
    """config with `decode.KEY=VALUE` items applied and checked; any other key is refused,
    since the weights were trained for the rest of the config."""
    if not overrides:
        return config
    for item in overrides:
        if not item.partition("=")[0].strip().startswith("decode."):
            raise UserError(f"--set {item}: eval changes only how a seq2seq run decodes ({DECODE_KEYS})")
    if config.task.type != "seq2seq":
        raise UserError(f"--set {overrides[0]}: this is a {config.task.type} run; only seq2seq runs decode")
    config = copy.deepcopy(config)
    for item in overrides:
        apply_override(config, item)
    validate(config, "--set")
    return config
