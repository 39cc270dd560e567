"""Config loading: built-ins, typed `--set` overrides, and one-line errors that name the
file, the key and the fix."""

import dataclasses

import pytest

from trainformer.config import (
    DEFAULT_CONFIG,
    ConfigError,
    ExperimentConfig,
    builtin_names,
    load_config,
    load_config_naming,
)
from trainformer.errors import UserError

REQUIRED_KEYS = {
    "model.d_model": int, "model.num_layers": int, "model.num_heads": int, "model.dff": int,
    "model.dropout": float, "model.norm": str, "model.position": str,
    "data.corpus": str, "data.seq_len": int,
    "tokenizer.vocab_size": int,
    "train.steps": int, "train.batch_size": int, "train.learning_rate": float,
    "train.warmup_steps": int, "train.seed": int, "train.checkpoint_every": int, "train.eval_every": int,
}


def flatten(tree, prefix=""):
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def write(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    assert isinstance(info.value, UserError)  # the CLI turns it into one line + exit 2
    return str(info.value)


# --- built-ins ------------------------------------------------------------------------------

def test_builtin_names_include_both_shipped_configs():
    assert {"zh-bert-tiny", "zh-bert-80m"} <= set(builtin_names())


def test_default_is_zh_bert_tiny():
    config = load_config()
    assert DEFAULT_CONFIG == "zh-bert-tiny"
    assert config.name == "zh-bert-tiny"
    assert config == load_config("zh-bert-tiny")
    assert (config.model.d_model, config.model.num_layers, config.model.num_heads) == (128, 2, 2)
    assert config.train.learning_rate == pytest.approx(1e-3)


def test_zh_bert_80m_loads_with_its_own_values():
    config = load_config("zh-bert-80m")
    assert config.name == "zh-bert-80m"
    assert (config.model.d_model, config.model.num_layers, config.model.num_heads) == (768, 11, 12)
    assert config.model.dff == 3072
    assert config.model.position == "learned"
    assert config.tokenizer.vocab_size == 21128
    assert config.train.precision == "auto"
    assert isinstance(config.train.learning_rate, float)


@pytest.mark.parametrize("name", ["zh-bert-tiny", "zh-bert-80m"])
def test_every_key_the_product_needs_exists_with_its_type(name):
    flat = flatten(load_config(name).to_dict())
    for key, kind in REQUIRED_KEYS.items():
        assert key in flat, key
        assert type(flat[key]) is kind, (key, flat[key])


# --- overrides ------------------------------------------------------------------------------

def test_overrides_are_parsed_by_declared_type():
    config = load_config(None, [
        "train.steps=200", "train.learning_rate=1e-3", "model.dropout=0", "tokenizer.lowercase=false",
        "model.norm=pre", "data.corpus=news.txt", "train.warmup_steps = 20",
    ])
    assert config.train.steps == 200 and type(config.train.steps) is int
    assert config.train.learning_rate == 1e-3 and type(config.train.learning_rate) is float
    assert config.model.dropout == 0.0 and type(config.model.dropout) is float
    assert config.tokenizer.lowercase is False
    assert config.model.norm == "pre"
    assert config.data.corpus == "news.txt"
    assert config.train.warmup_steps == 20
    # the rest is untouched
    assert config.model.d_model == load_config().model.d_model


@pytest.mark.parametrize("text, expected", [("true", True), ("1", True), ("yes", True), ("False", False), ("0", False)])
def test_bool_override_spellings(text, expected):
    assert load_config(None, [f"tokenizer.lowercase={text}"]).tokenizer.lowercase is expected


def test_unknown_override_key_suggests_closest():
    message = error_of(None, ["train.stesp=3"])
    assert "train.stesp" in message
    assert "did you mean 'train.steps'" in message


def test_unknown_override_section_suggests_closest():
    assert "did you mean 'model'" in error_of(None, ["modle.d_model=3"])


@pytest.mark.parametrize("item, key", [("train.steps=abc", "train.steps"), ("train.learning_rate=fast", "train.learning_rate"),
                                       ("tokenizer.lowercase=maybe", "tokenizer.lowercase")])
def test_override_of_wrong_type_names_the_key(item, key):
    message = error_of(None, [item])
    assert key in message
    assert item.split("=")[1] in message


def test_override_without_equals_sign_is_rejected():
    assert "key=value" in error_of(None, ["train.steps"])


# --- YAML files -----------------------------------------------------------------------------

def test_unknown_key_in_file_names_file_and_suggests(tmp_path):
    path = write(tmp_path, "model:\n  d_modle: 128\n")
    message = error_of(str(path))
    assert str(path) in message
    assert "model.d_modle" in message
    assert "did you mean 'model.d_model'" in message


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path):
    message = error_of(str(write(tmp_path, "train:\n  zzzzzz: 1\n")))
    assert "train.zzzzzz" in message and "train.steps" in message


def test_wrong_type_in_file_names_the_key(tmp_path):
    path = write(tmp_path, 'train:\n  steps: "abc"\n')
    message = error_of(str(path))
    assert str(path) in message
    assert "train.steps" in message
    assert "abc" in message


def test_bool_is_not_accepted_as_int(tmp_path):
    assert "train.steps" in error_of(str(write(tmp_path, "train:\n  steps: true\n")))


def test_section_that_is_not_a_mapping_is_rejected(tmp_path):
    assert "model" in error_of(str(write(tmp_path, "model: 3\n")))


def test_file_values_and_defaults_merge(tmp_path):
    config = load_config(str(write(tmp_path, "model:\n  d_model: 64\n  num_heads: 2\ntrain:\n  learning_rate: 0.01\n")))
    assert config.name == "exp"  # the file stem
    assert config.model.d_model == 64 and config.model.num_heads == 2
    assert config.train.learning_rate == 0.01
    assert config.model.num_layers == ExperimentConfig().model.num_layers


def test_d_model_not_divisible_by_heads_names_both_keys(tmp_path):
    message = error_of(str(write(tmp_path, "model:\n  d_model: 100\n  num_heads: 3\n")))
    assert "model.d_model" in message and "model.num_heads" in message
    assert "model.d_model" in error_of(None, ["model.num_heads=5"])


def test_invalid_choice_for_norm(tmp_path):
    message = error_of(str(write(tmp_path, "model:\n  norm: middle\n")))
    assert "model.norm" in message and "middle" in message
    assert "post" in message and "pre" in message


@pytest.mark.parametrize("override, key", [
    ("train.steps=0", "train.steps"), ("model.dropout=1.0", "model.dropout"),
    ("data.seq_len=4", "data.seq_len"), ("train.warmup_steps=-1", "train.warmup_steps"),
    ("train.minutes=-1", "train.minutes"),
    ("tokenizer.vocab_size=50", "tokenizer.vocab_size"), ("train.precision=fp8", "train.precision"),
    ("decode.strategy=sample", "decode.strategy"), ("decode.beam_size=0", "decode.beam_size"),
    ("decode.max_length=65", "decode.max_length"), ("train.label_smoothing=1.0", "train.label_smoothing"),
    ("train.batch_tokens=0", "train.batch_tokens"), ("model.decoder_layers=-1", "model.decoder_layers"),
    ("model.ngram_buckets=-1", "model.ngram_buckets"), ("model.ngram_buckets=131073", "model.ngram_buckets"),
])
def test_impossible_values_name_the_key(override, key):
    assert key in error_of(None, [override])


@pytest.mark.parametrize("overrides, message", [
    (["task.type=classify", "train.layer_decay=0"], "train.layer_decay: must be in (0, 1]"),
    (["task.type=classify", "train.layer_decay=1.5"], "train.layer_decay: must be in (0, 1]"),
    (["train.layer_decay=0.8"], "train.layer_decay: fine-tunes a classifier's encoder; a mlm run"),
    (["task.type=classify", "model.pooling=max"], "model.pooling: 'max' is not one of cls, mean"),
    (["model.pooling=mean"], "model.pooling: mean pools for a classifier's head; a mlm run"),
    (["data.input_mask_rate=0.1"], "data.input_mask_rate: hides a classifier's input tokens; a mlm run"),
    (["train.distill_from=runs/teacher"], "train.distill_from: teaches a classifier from others' probabilities; a mlm run"),
    (["task.type=classify", "data.input_mask_rate=1"], "data.input_mask_rate: must be in (0.0, 1.0)"),
    (["task.type=classify", "train.rdrop=-1"], "train.rdrop: must be >= 0"),
    (["train.label_smoothing=0.1"], "train.label_smoothing: softens a classifier's or a decoder's targets; a mlm run"),
    (["task.type=classify", "train.label_smoothing=0.1", "train.distill_from=runs/a"],
     "train.label_smoothing: the labels it would soften are replaced by the teachers' probabilities"),
    (["train.rdrop=1"], "train.rdrop: compares a classifier's two predictions of each text; a mlm run"),
    (["task.type=classify", "train.rdrop=1", "model.dropout=0"], "train.rdrop: compares two dropout draws, and "
                                                                  "model.dropout is 0"),
    (["train.noisy_tune=-0.1", "model.init_from=runs/a"], "train.noisy_tune: must be >= 0"),
    (["train.noisy_tune=0.15"], "train.noisy_tune: perturbs the weights a run starts from, and model.init_from is "
                                "empty"),
])
def test_fine_tuning_keys_are_checked(overrides, message):
    assert message in error_of(None, overrides)


@pytest.mark.parametrize("overrides, message", [
    (["data.selective_masking=-1"], "data.selective_masking: must be >= 0"),
    (["task.type=classify", "data.selective_masking=2"], "data.selective_masking: chooses the tokens a masked-LM"),
    (["task.type=classify", "data.shift_windows=true"], "data.shift_windows: cuts a masked-LM run's packed windows"),
    (["data.packing=sentences"], "data.packing: 'sentences' is not one of stream, documents"),
    (["task.type=classify", "data.packing=documents"], "data.packing: cuts a masked-LM run's windows"),
    (["data.packing=documents", "data.shift_windows=true"], "data.packing: documents is not with data.shift_windows"),
    (["data.long_seq_len=-1"], "data.long_seq_len: must be >= 0"),
    (["task.type=classify", "data.long_seq_len=256"], "data.long_seq_len: pretraining windows"),
    (["data.long_seq_len=64"], "data.long_seq_len: 64 must be more than data.seq_len=64"),
    (["data.long_seq_len=96"], "data.long_seq_len: 96 tokens do not divide a batch of train.batch_size x "
                               "data.seq_len = 2048 tokens"),
    (["data.long_seq_len=256", "data.long_fraction=1"], "data.long_fraction: must be in (0, 1)"),
    (["data.long_seq_len=256", "model.max_length=128"], "model.max_length: 128 positions cannot hold "
                                                       "data.long_seq_len=256"),
    (["task.type=classify", "data.mask_spread=0.05"], "data.mask_spread: schedules a masked-LM run's masking rate"),
    (["data.mask_rate=0.15", "data.mask_spread=0.2"], "data.mask_spread: the rate falls from data.mask_rate + "
                                                      "spread to data.mask_rate - spread, both in (0, 1); with "
                                                      "data.mask_rate=0.15 the spread must be in (0, 0.15), got 0.2"),
    (["data.mask_rate=0.15", "data.mask_spread=-0.1"], "data.mask_spread: the rate falls"),
])
def test_pretraining_window_and_mask_keys_are_checked(overrides, message):
    assert message in error_of(None, overrides)


def test_fine_tuning_keys_default_off_and_load():
    default = load_config(None)
    assert (default.train.layer_decay, default.train.keep_best, default.model.pooling) == (1.0, False, "cls")
    tuned = load_config("zh-sentiment", ["train.layer_decay=0.8", "train.keep_best=true", "model.pooling=mean"])
    assert (tuned.train.layer_decay, tuned.train.keep_best, tuned.model.pooling) == (0.8, True, "mean")
    assert load_config(None, ["train.keep_best=true"]).train.keep_best  # any task keeps its best accuracy


def test_missing_config_file_names_the_path(tmp_path):
    path = tmp_path / "nope.yaml"
    message = error_of(str(path))
    assert str(path) in message
    assert "not found" in message


def test_unknown_builtin_name_lists_builtins():
    message = error_of("zh-bert-huge")
    assert "zh-bert-huge" in message and "zh-bert-tiny" in message and "zh-bert-80m" in message


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "model:\n  d_model: 64\n  num_heads: [2\n  dff: 128\n")
    message = error_of(str(path))
    assert str(path) in message
    assert "line 4" in message


def test_top_level_must_be_a_mapping(tmp_path):
    assert "mapping" in error_of(str(write(tmp_path, "- a\n- b\n")))


# --- round trip -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["zh-bert-tiny", "zh-bert-80m", "en-zh-translate", "zh-headline"])
def test_dump_then_load_gives_an_equal_config(tmp_path, name):
    config = load_config(name, ["train.learning_rate=3e-5", "model.norm=pre", "data.corpus=my news.txt"])
    path = tmp_path / "config.yaml"
    config.dump(path)
    again = load_config(str(path))
    assert again == config
    assert dataclasses.asdict(again) == dataclasses.asdict(config)


def test_yaml_float_in_exponent_form_is_accepted(tmp_path):
    config = load_config(str(write(tmp_path, "train:\n  learning_rate: 1e-3\n")))
    assert config.train.learning_rate == pytest.approx(1e-3)


@pytest.mark.parametrize("item", ["train=3", "model.d_model.x=3"])
def test_override_of_a_section_or_through_a_leaf_is_a_config_error(item):
    error_of(None, [item])


def test_defaults_are_the_default_job(tmp_path):
    """A YAML file that leaves keys out gets the README's defaults (the default job's)."""
    config = load_config(str(write(tmp_path, "data:\n  corpus: news.txt\n")))
    tiny = load_config("zh-bert-tiny")
    assert dataclasses.replace(config, name=tiny.name, data=tiny.data) == tiny
    assert config == ExperimentConfig(name="exp", data=dataclasses.replace(tiny.data, corpus="news.txt"))


def test_base_starts_a_file_from_a_builtin(tmp_path):
    config = load_config(str(write(tmp_path, "base: zh-bert-80m\ntrain:\n  steps: 10\n")))
    big = load_config("zh-bert-80m")
    assert config.name == "exp" and config.train.steps == 10
    assert config.model == big.model and config.train.learning_rate == big.train.learning_rate


def test_base_can_be_a_file_next_to_the_config(tmp_path):
    write(tmp_path, "model:\n  d_model: 64\n", name="common.yaml")
    config = load_config(str(write(tmp_path, "base: common.yaml\nmodel:\n  num_layers: 3\n")))
    assert (config.model.d_model, config.model.num_layers) == (64, 3)


def test_a_base_chain_that_loops_is_an_error(tmp_path):
    write(tmp_path, "base: b.yaml\n", name="a.yaml")
    write(tmp_path, "base: a.yaml\n", name="b.yaml")
    assert "comes back" in error_of(str(tmp_path / "a.yaml"))


def test_set_without_equals_names_the_missing_equals():
    """`--set train.steps 50`: argparse hands over "train.steps" and "50" as the CONFIG."""
    message = error_of("50", ["train.steps"])
    assert "--set train.steps" in message and "'='" in message


def test_warmup_longer_than_the_run_is_accepted():
    assert load_config(None, ["train.steps=100"]).train.warmup_steps == 200  # capped when the run starts


def test_the_keys_a_config_names_are_those_of_its_file_its_bases_and_set(tmp_path):
    """What model.init_from may fill in: keys no file or --set names (run_dir.inherit_encoder)."""
    write(tmp_path, "model:\n  d_model: 64\n", name="common.yaml")
    path = write(tmp_path, "base: common.yaml\nmodel:\n  dropout: 0.1\ntrain:\n  steps: 10\n")
    config, named = load_config_naming(str(path), ["model.num_layers=3"])
    assert config == load_config(str(path), ["model.num_layers=3"])
    assert {"model.d_model", "model.dropout", "train.steps", "model.num_layers"} <= named
    assert not named & {"model.num_heads", "model.dff", "model.norm", "model.position", "model.max_length"}
    # without CONFIG the built-in default only spells out the dataclasses' defaults: it names nothing
    assert load_config_naming(None, ["train.steps=5"])[1] == {"train.steps"}
    assert "model.d_model" in load_config_naming("zh-bert-tiny")[1]  # named by a built-in asked for
    assert "model.d_model" not in load_config_naming("zh-sentiment")[1]  # fine-tunes take the source's


def test_a_step_count_set_on_the_command_line_beats_the_recipes_minutes():
    """zh-bert-small fills 40 minutes; --set train.steps=N asks for N steps, not the budget's."""
    assert load_config("zh-bert-small").train.minutes == 40
    steps_only = load_config("zh-bert-small", ["train.steps=8000"]).train
    assert (steps_only.steps, steps_only.minutes) == (8000, 0.0)
    both = load_config("zh-bert-small", ["train.steps=8000", "train.minutes=10"]).train
    assert (both.steps, both.minutes) == (8000, 10.0)
