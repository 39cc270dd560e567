"""Hugging Face BERT export: the mapping read both ways gives back every bit.

- import(export(run)) restores every weight of a trained mlm and a trained classify run;
- export(import(tiny-hf-bert)) gives back the tensors transformers itself wrote (modulo the two
  documented changes: the vocabulary order and the token-type row folded into the positions);
- the mapping is a bijection over the fixture's names, and a transposed matrix is caught;
- what BERT cannot express is refused with one line, exit 2.
Neither torch nor transformers is needed (README "Export to Hugging Face" has the check with them).
"""

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from cli_helpers import TINY, TINY_NEWS, in_process, trainformer
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from test_hf_import import FIXTURE, REFERENCE, TOLERANCE, copy_fixture, fixture_tensors, hidden_state_error, quiet

from trainformer.config import CHOICES, load_config
from trainformer.data.tokenizer import Tokenizer, train_vocab
from trainformer.errors import UserError
from trainformer.interop.bert_mapping import (HF_ACTIVATIONS, HIDDEN_ACTS, TOKEN_TYPE_TABLE, full_name, model_ties,
                                              pooler_ties)
from trainformer.interop.hf_export import export_hf
from trainformer.interop.hf_folder import BERT_DEFAULTS
from trainformer.interop.hf_import import import_hf_bert
from trainformer.model.heads import build_classifier, build_masked_lm
from trainformer.run_dir import RunDir
from trainformer.train.checkpoint import find_checkpoint, restore_model

BERT_SHAPE = ["--set", "model.norm=post", "--set", "model.position=learned", "--set", "train.steps=10",
              "--set", "train.precision=fp32"]
EXPORTED_FILES = ["config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
                  "tokenizer_config.json", "vocab.txt"]
NSP = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, vocab_args):
    """A tiny mlm run (gelu_tanh) and a tiny classify run (gelu, exact), BERT-shaped, 10 steps of real text."""
    root = tmp_path_factory.mktemp("trained")
    trainformer("train", "zh-bert-tiny", "--run-dir", str(root / "mlm"), *TINY_NEWS, *vocab_args, *BERT_SHAPE)
    trainformer("train", "zh-intent", "--run-dir", str(root / "classify"), *TINY, *BERT_SHAPE,
                "--set", "model.activation=gelu")
    return {"mlm": root / "mlm", "classify": root / "classify"}


def restored(run_dir: Path):
    """The run's model (MaskedLM or Classifier) with its latest checkpoint."""
    config = RunDir(run_dir).load_config()
    vocab_size = len((run_dir / "tokenizer" / "vocab.txt").read_text(encoding="utf-8").splitlines())
    max_length = config.model.max_length or config.data.seq_len
    if config.task.type == "classify":
        labels = json.loads((run_dir / "labels.json").read_text(encoding="utf-8"))
        model = build_classifier(config.model, vocab_size, max_length, len(labels))
    else:
        model = build_masked_lm(config.model, vocab_size, max_length)
    restore_model(model, find_checkpoint(run_dir / "checkpoints"))
    return model


def weights_by_path(variables) -> dict:
    values = {v.path: np.asarray(v.numpy()) for v in variables if not v.path.endswith("seed_generator_state")}
    assert len(values) == len([v for v in variables if not v.path.endswith("seed_generator_state")])  # unique paths
    return values


def assert_same_weights(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    changed = [path for path in ours if ours[path].shape != theirs[path].shape
               or ours[path].dtype != theirs[path].dtype or not np.array_equal(ours[path], theirs[path])]
    assert not changed, f"not restored bit for bit: {changed}"


# --- import(export(run)) ---------------------------------------------------------------------

def test_import_of_an_mlm_export_restores_every_weight(trained, tmp_path):
    lines = []
    hf_config = export_hf(trained["mlm"], tmp_path / "hf", say=lines.append)
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == EXPORTED_FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging folder left
    assert hf_config["architectures"] == ["BertForMaskedLM"] and hf_config["hidden_act"] == "gelu_new"
    assert "as BertForMaskedLM" in lines[-1]
    summary = import_hf_bert(tmp_path / "hf", tmp_path / "back", say=quiet)
    assert summary["fresh"] == ["pooler (no bert.pooler.* tensors)"] and summary["dropped"] == {}
    original, back = restored(trained["mlm"]), restored(tmp_path / "back")
    assert_same_weights(weights_by_path(original.weights), weights_by_path(back.weights))
    assert (tmp_path / "back" / "tokenizer" / "vocab.txt").read_bytes() == \
        (trained["mlm"] / "tokenizer" / "vocab.txt").read_bytes()


def test_import_of_a_classify_export_restores_every_weight(trained, tmp_path):
    """The import keeps encoder and pooler (the classifier layer's labels are not imported): those
    come back through it, the classifier layer is read from the file by its HF name."""
    hf_config = export_hf(trained["classify"], tmp_path / "hf", say=quiet)
    labels = json.loads((trained["classify"] / "labels.json").read_text(encoding="utf-8"))
    assert hf_config["architectures"] == ["BertForSequenceClassification"] and hf_config["hidden_act"] == "gelu"
    assert hf_config["id2label"] == {str(i): label for i, label in enumerate(labels)}
    assert hf_config["label2id"] == {label: i for i, label in enumerate(labels)}
    summary = import_hf_bert(tmp_path / "hf", tmp_path / "back", say=quiet)
    assert set(summary["dropped"]) == {"classifier.weight", "classifier.bias"}
    original = restored(trained["classify"])
    back = build_classifier(RunDir(tmp_path / "back").load_config().model, original.encoder.vocab_size,
                            original.encoder.max_length, len(labels))
    tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=back.encoder), pooler=back.head.pooler).restore(
        summary["checkpoint"]).expect_partial().assert_existing_objects_matched()
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    back.head.logits.kernel.assign(tensors["classifier.weight"].T)  # HF Linear: (labels, d)
    back.head.logits.bias.assign(tensors["classifier.bias"])
    assert_same_weights(weights_by_path(original.weights), weights_by_path(back.weights))


# --- export(import(fixture)) -----------------------------------------------------------------

@pytest.fixture(scope="module")
def reexported(tmp_path_factory):
    root = tmp_path_factory.mktemp("reexported")
    import_hf_bert(FIXTURE, root / "run", say=quiet)
    export_hf(root / "run", root / "hf", say=quiet)
    return root / "hf"


def test_export_of_the_imported_fixture_gives_back_its_tensors(reexported):
    """Every tensor transformers wrote, bit for bit, but: the pooler and the NSP head (a
    BertForMaskedLM has neither), the rows of the word embeddings and output bias (our ids put
    the specials first: compared token by token), and token type 0, folded into the positions."""
    original, exported = fixture_tensors(), load_file(str(reexported / "model.safetensors"))
    kept = {name for name in original if not name.startswith(("bert.pooler.", "cls.seq_relationship."))}
    assert sorted(exported) == sorted(kept)
    hf_vocab = (FIXTURE / "vocab.txt").read_text(encoding="utf-8").splitlines()
    rows = [hf_vocab.index(token) for token in (reexported / "vocab.txt").read_text(encoding="utf-8").splitlines()]
    words, positions = "bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight"
    types = original["bert.embeddings.token_type_embeddings.weight"]
    bias = "cls.predictions.bias"
    expected = {**original, words: original[words][rows], bias: original[bias][rows],
                positions: original[positions] + types[0], full_name(TOKEN_TYPE_TABLE): np.zeros_like(types)}
    for name in kept:
        assert exported[name].dtype == np.float32 and exported[name].shape == original[name].shape, name
        assert np.array_equal(exported[name], expected[name]), name


def test_export_of_the_imported_fixture_has_its_config(reexported):
    ours = json.loads((reexported / "config.json").read_text())
    theirs = {**BERT_DEFAULTS, **json.loads((FIXTURE / "config.json").read_text())}
    keys = ["model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
            "type_vocab_size", "layer_norm_eps", "position_embedding_type", "pad_token_id", "tie_word_embeddings",
            "is_decoder", "add_cross_attention", "initializer_range"]
    assert {key: ours[key] for key in keys} == {key: theirs[key] for key in keys}
    assert ours["architectures"] == ["BertForMaskedLM"]
    tokenizer = json.loads((reexported / "tokenizer_config.json").read_text())
    assert tokenizer["do_lower_case"] is True and tokenizer["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((reexported / "special_tokens_map.json").read_text())["mask_token"] == "[MASK]"
    with safe_open(str(reexported / "model.safetensors"), "np") as weights:
        assert weights.metadata()["format"] == "pt"  # transformers refuses a file without it


def test_exported_tokenizer_gives_our_ids(reexported):
    """tokenizer.json (what AutoTokenizer loads) applies NFKC as ours does: full-width "，" and
    "！" give the ids of "," and "!", not [UNK] as HF's BertTokenizer would."""
    from tokenizers import Tokenizer as FastTokenizer

    ours = Tokenizer.load(reexported.parent / "run" / "tokenizer")
    theirs = FastTokenizer.from_file(str(reexported / "tokenizer.json"))
    texts = [str(text) for text in REFERENCE["texts"]] + ["你好，世界！ＡＢＣ", "Ünïcode  BERT\t学生们"]
    for text, ids in zip(texts, ours(tf.constant(texts)).to_list()):
        assert theirs.encode(text).ids == [2, *ids, 3], text


# --- the mapping itself ----------------------------------------------------------------------

def test_every_activation_exports_as_an_hf_hidden_act_that_imports_back():
    for activation in CHOICES["model.activation"]:
        assert HIDDEN_ACTS[HF_ACTIVATIONS[activation]] == activation


def test_mapping_is_a_bijection_over_the_fixture(tmp_path):
    """Each HF name once, each weight of ours in exactly one Tie, the shapes the fixture's."""
    run_dir = tmp_path / "run"
    import_hf_bert(FIXTURE, run_dir, say=quiet)
    model = restored(run_dir)
    pooler = keras.layers.Dense(32, activation="tanh", name="pooler")
    pooler.build((None, 32))
    ties = model_ties(model) + pooler_ties(pooler)
    names = [full_name(name) for tie in ties for name in tie.names]
    assert len(names) == len(set(names))
    assert set(names) | {full_name(TOKEN_TYPE_TABLE), *NSP} == set(fixture_tensors())
    variables = [id(tie.variable) for tie in ties]
    weights = [v for v in model.weights + pooler.weights if not v.path.endswith("seed_generator_state")]
    assert len(variables) == len(set(variables)) and set(variables) == {id(v) for v in weights}
    shapes = {full_name(name): shape for tie in ties for name, shape in zip(tie.names, tie.hf_shapes())}
    assert shapes == {name: value.shape for name, value in fixture_tensors().items() if name in shapes}


def test_a_transposed_square_matrix_is_caught(tmp_path):
    """Square matrices fit either way round: only values tell. A transposed one (what a Tie
    missing `linear` would do) imports, and the parity with transformers' own outputs fails."""
    name = "bert.encoder.layer.0.attention.output.dense.weight"
    tensors = fixture_tensors()
    assert tensors[name].shape[0] == tensors[name].shape[1]
    tensors[name] = np.ascontiguousarray(tensors[name].T)
    import_hf_bert(copy_fixture(tmp_path / "hf", tensors), tmp_path / "run", say=quiet)
    assert hidden_state_error(tmp_path / "run") > 100 * TOLERANCE
    assert REFERENCE["last_hidden_state"].shape[-1] == 32


# --- refusals ---------------------------------------------------------------------------------

def config_only_run(folder: Path, name: str, *overrides: str) -> Path:
    """A run directory holding just a real built-in config: a refusal comes before any weight is read."""
    folder.mkdir(parents=True)
    load_config(name, list(overrides)).dump(folder / "config.yaml")
    return folder


def test_unmappable_settings_are_refused_through_the_command_line(tmp_path):
    pre_ln = config_only_run(tmp_path / "pre", "zh-intent")  # pre-LN, sinusoidal: norm is named first
    result = in_process("export", str(pre_ln), "--format", "hf", "--out", str(tmp_path / "out"), check=False)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "model.norm pre has no Hugging Face BERT equivalent" in result.stderr
    seq2seq = config_only_run(tmp_path / "seq2seq", "en-zh-translate")
    result = in_process("export", str(seq2seq), "--format", "hf", "--out", str(tmp_path / "out"), check=False)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "task.type seq2seq has no Hugging Face BERT equivalent" in result.stderr
    result = in_process("export", str(pre_ln), "--format", "hf,onnx", "--out", str(tmp_path / "out"), check=False)
    assert result.returncode == 2 and "--format hf: give it alone" in result.stderr
    assert not (tmp_path / "out").exists()


def test_sinusoidal_positions_are_refused(tmp_path):
    run_dir = config_only_run(tmp_path / "run", "zh-bert-tiny", "model.norm=post")
    with pytest.raises(UserError, match=r"model.position sinusoidal has no Hugging Face BERT equivalent") as caught:
        export_hf(run_dir, tmp_path / "out", say=quiet)
    assert "\n" not in str(caught.value) and not (tmp_path / "out").exists()


def test_rotary_positions_are_refused(tmp_path):
    run_dir = config_only_run(tmp_path / "run", "zh-bert-tiny", "model.norm=post", "model.position=rope")
    with pytest.raises(UserError, match=r"model.position rope has no Hugging Face BERT equivalent"):
        export_hf(run_dir, tmp_path / "out", say=quiet)


def test_mean_pooling_is_refused(tmp_path):
    """BERT's pooler reads [CLS]: a BertForSequenceClassification would answer otherwise."""
    run_dir = config_only_run(tmp_path / "run", "zh-intent", "model.norm=post", "model.position=learned",
                              "model.pooling=mean")
    with pytest.raises(UserError, match=r"model.pooling mean has no Hugging Face BERT equivalent \(BERT's pooler "
                                        r"reads the \[CLS\] vector") as caught:
        export_hf(run_dir, tmp_path / "out", say=quiet)
    assert "\n" not in str(caught.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("setting, refused", [("model.ngram_buckets=64", "model.ngram_buckets 64"),
                                              ("model.use_bias=false", "model.use_bias False"),
                                              ("model.glu=true", "model.glu True")])
def test_ngram_embeddings_bias_free_and_gated_blocks_are_refused(tmp_path, setting, refused):
    run_dir = config_only_run(tmp_path / "run", "zh-bert-tiny", "model.norm=post", "model.position=learned", setting)
    with pytest.raises(UserError, match=f"{refused} has no Hugging Face BERT equivalent") as caught:
        export_hf(run_dir, tmp_path / "out", say=quiet)
    assert "\n" not in str(caught.value) and not (tmp_path / "out").exists()


def test_a_word_aware_vocabulary_is_refused(tmp_path):
    """BERT's tokenizer splits every Chinese character: it would read other ids than ours."""
    run_dir = config_only_run(tmp_path / "run", "zh-bert-tiny", "model.norm=post", "model.position=learned")
    train_vocab(["这个手机很好用"] * 3, run_dir / "tokenizer", 100, 2, lowercase=True, words=True)
    with pytest.raises(UserError, match=r"tokenizer.json: a word-aware vocabulary \(tokenizer.words\) has no "
                                        r"Hugging Face BERT tokenizer equivalent") as caught:
        export_hf(run_dir, tmp_path / "out", say=quiet)
    assert "\n" not in str(caught.value) and not (tmp_path / "out").exists()


def test_out_is_replaced_only_when_it_is_an_earlier_hf_export(reexported, tmp_path):
    run_dir = reexported.parent / "run"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    save_file({"x": np.zeros(2, np.float32)}, str(mine / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"--out .*mine: exists and is not a trainformer Hugging Face export"):
        export_hf(run_dir, mine, say=quiet)
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "model.safetensors"]
    export_hf(run_dir, tmp_path / "again", say=quiet)
    (tmp_path / "again" / "stale.txt").write_text("from before")
    export_hf(run_dir, tmp_path / "again", say=quiet)  # an earlier export: replaced whole
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == EXPORTED_FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "mine"]
