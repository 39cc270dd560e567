"""Hugging Face BERT import: the imported run computes what `transformers` computes.

The fixture tests/fixtures/tiny-hf-bert (scripts/make_tiny_hf_bert.py) is a tiny random
BertForPreTraining with a bert-base-chinese-like vocabulary, saved by transformers, and the
outputs transformers computed for a fixed batch. Neither torch nor transformers is needed here.
"""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file, save_file

from trainformer.config import load_config
from trainformer.data.tokenizer import Tokenizer
from trainformer.errors import UserError
from trainformer.interop.hf_import import import_hf_bert
from trainformer.model.heads import build_classifier, build_masked_lm
from trainformer.run_dir import RunDir
from trainformer.tokens import SPECIAL_TOKENS
from trainformer.train.checkpoint import find_checkpoint, restore_model

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tiny-hf-bert"
REFERENCE = np.load(FIXTURE / "reference.npz")
HF_VOCAB = (FIXTURE / "vocab.txt").read_text(encoding="utf-8").splitlines()
TOLERANCE = 1e-4  # float32 parity


def quiet(text):
    pass


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("imported") / "run"
    lines = []
    summary = import_hf_bert(FIXTURE, run_dir, say=lines.append)
    return run_dir, summary, lines


def hf_to_ours(run_dir: Path) -> np.ndarray:
    """Our id of every HF id, from the two vocabulary files."""
    ours = {token: i for i, token in enumerate(Tokenizer.load(run_dir / "tokenizer").vocab)}
    return np.array([ours[token] for token in HF_VOCAB])


def restored_masked_lm(run_dir: Path):
    config = RunDir(run_dir).load_config()
    model = build_masked_lm(config.model, config.tokenizer.vocab_size, config.model.max_length or config.data.seq_len)
    step = restore_model(model, find_checkpoint(run_dir / "checkpoints"))
    return model, step


def reference_inputs(run_dir: Path) -> dict:
    return {"token_ids": hf_to_ours(run_dir)[REFERENCE["input_ids"]].astype("int32"),
            "padding_mask": REFERENCE["attention_mask"].astype(bool)}


def hidden_state_error(run_dir: Path) -> float:
    model, _ = restored_masked_lm(run_dir)
    hidden = np.asarray(model.encoder(reference_inputs(run_dir), training=False))
    return float(np.abs(hidden - REFERENCE["last_hidden_state"]).max())


# --- parity ---------------------------------------------------------------------------------

def test_hidden_states_match_transformers(imported):
    run_dir, _, _ = imported
    assert not REFERENCE["attention_mask"].all()  # the batch holds a padded row
    assert hidden_state_error(run_dir) <= TOLERANCE  # every position, padded ones included


def test_mlm_logits_match_transformers(imported):
    run_dir, _, _ = imported
    model, step = restored_masked_lm(run_dir)
    assert step == 0
    inputs = reference_inputs(run_dir)
    batch, seq = inputs["token_ids"].shape
    inputs["masked_positions"] = np.tile(np.arange(seq, dtype="int32"), (batch, 1))
    logits = np.asarray(model(inputs, training=False))  # (batch, seq, vocab) in our ids
    assert np.abs(logits[..., hf_to_ours(run_dir)] - REFERENCE["mlm_logits"]).max() <= TOLERANCE


def test_pooler_restores_into_a_classifier(imported):
    """The recipe of hf_import's docstring: encoder + pooler of an imported run into a Classifier."""
    run_dir, _, _ = imported
    config = RunDir(run_dir).load_config()
    classifier = build_classifier(config.model, config.tokenizer.vocab_size, config.model.max_length, num_labels=3)
    status = tf.train.Checkpoint(model=tf.train.Checkpoint(encoder=classifier.encoder),
                                 pooler=classifier.head.pooler).restore(find_checkpoint(run_dir / "checkpoints"))
    status.expect_partial().assert_existing_objects_matched()
    sequence = classifier.encoder(reference_inputs(run_dir), training=False)
    np.testing.assert_allclose(np.asarray(sequence), REFERENCE["last_hidden_state"], rtol=0, atol=TOLERANCE)
    pooled = np.asarray(classifier.head.pooler(sequence[:, 0]))
    np.testing.assert_allclose(pooled, REFERENCE["pooler_output"], rtol=0, atol=TOLERANCE)


def test_tokenizer_gives_the_hf_tokenizer_ids(imported):
    run_dir, summary, _ = imported
    tokenizer = Tokenizer.load(run_dir / "tokenizer")
    assert tuple(tokenizer.vocab[:5]) == SPECIAL_TOKENS and tokenizer.lowercase and summary["lowercase"]
    ids = tokenizer(tf.constant([str(text) for text in REFERENCE["texts"]])).to_list()
    mapping = hf_to_ours(run_dir)
    expected = [[int(mapping[i]) for i in row if i >= 0] for row in REFERENCE["text_ids"]]
    assert ids == expected
    assert sorted(tokenizer.vocab) == sorted(HF_VOCAB)  # reordered, nothing lost


def test_run_dir_contents(imported):
    run_dir, summary, lines = imported
    config = load_config(str(run_dir / "config.yaml"))  # a valid trainformer config
    m = config.model
    assert (config.task.type, m.d_model, m.num_layers, m.num_heads, m.dff) == ("mlm", 32, 2, 2, 64)
    assert (m.norm, m.position, m.activation, m.max_length, m.dropout) == ("post", "learned", "gelu", 64, 0.1)
    assert (config.data.seq_len, config.tokenizer.vocab_size) == (64, len(HF_VOCAB))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    sha = hashlib.sha256((FIXTURE / "model.safetensors").read_bytes()).hexdigest()
    assert manifest["imported_from"]["files"] == {"model.safetensors": sha}
    assert manifest["num_params"] == summary["num_params"] == restored_masked_lm(run_dir)[0].count_params()
    assert summary["checkpoint"] == tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    assert set(summary["dropped"]) == {"cls.seq_relationship.weight", "cls.seq_relationship.bias"}
    assert summary["fresh"] == [] and len(summary["mapped"]) == 44
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["run"]  # no staging folder left
    assert any("dropped 2 tensors: next-sentence" in line for line in lines)


# --- other layouts --------------------------------------------------------------------------

def copy_fixture(folder: Path, tensors=None, config=None, files=("vocab.txt", "tokenizer_config.json")) -> Path:
    """A copy of the fixture with its tensors / config.json replaced."""
    folder.mkdir(parents=True)
    for name in files:
        shutil.copy(FIXTURE / name, folder / name)
    hf_config = json.loads((FIXTURE / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf_config, **(config or {})}))
    if tensors is not None:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


def fixture_tensors() -> dict:
    return load_file(str(FIXTURE / "model.safetensors"))


def test_bert_model_layout_without_prefix_or_heads(tmp_path):
    """BertModel: no "bert." prefix, no MLM head (fresh), no tokenizer_config.json; into an
    existing empty run dir."""
    tensors = {k[len("bert."):]: v for k, v in fixture_tensors().items() if k.startswith("bert.")}
    hf_dir = copy_fixture(tmp_path / "hf", tensors, files=("vocab.txt",))
    (tmp_path / "run").mkdir()
    summary = import_hf_bert(hf_dir, tmp_path / "run", say=quiet)
    assert summary["fresh"] == ["MLM head (no cls.predictions.* tensors)"] and summary["dropped"] == {}
    assert summary["lowercase"] and "tokenizer_config.json" in summary["notes"][0]
    assert hidden_state_error(tmp_path / "run") <= TOLERANCE


def test_classification_fine_tune_drops_its_classifier(tmp_path):
    tensors = {k: v for k, v in fixture_tensors().items() if not k.startswith("cls.")}
    tensors.update({"classifier.weight": np.ones((2, 32), np.float32), "classifier.bias": np.zeros(2, np.float32)})
    hf_dir = copy_fixture(tmp_path / "hf", tensors, config={"architectures": ["BertForSequenceClassification"]})
    summary = import_hf_bert(hf_dir, tmp_path / "run", say=quiet)
    assert set(summary["dropped"]) == {"classifier.weight", "classifier.bias"}
    assert summary["fresh"] == ["MLM head (no cls.predictions.* tensors)"]
    assert hidden_state_error(tmp_path / "run") <= TOLERANCE


def test_old_names_and_saved_tied_copies(tmp_path):
    """Older checkpoints (bert-base-chinese's era): LayerNorm.gamma/beta, and the tied decoder
    matrix and bias saved as copies."""
    tensors = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in fixture_tensors().items()}
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"].copy()
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"].copy()
    summary = import_hf_bert(copy_fixture(tmp_path / "hf", tensors), tmp_path / "run", say=quiet)
    assert summary["fresh"] == [] and len(summary["mapped"]) == 46
    assert hidden_state_error(tmp_path / "run") <= TOLERANCE


def write_bfloat16(tensors: dict, path: Path) -> dict:
    """A safetensors file of bfloat16 tensors (numpy has no bfloat16: the format by hand);
    returns the float32 values they hold."""
    header, chunks, offset, values = {}, [], 0, {}
    for key, value in sorted(tensors.items()):
        bits = (value.astype(np.float32).view(np.uint32) >> 16).astype("<u2")  # truncate to bfloat16
        values[key] = (bits.astype(np.uint32) << 16).view(np.float32)
        data = bits.tobytes()
        header[key] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(chunks))
    return values


def test_bfloat16_weights_are_read_exactly(tmp_path):
    hf_dir = copy_fixture(tmp_path / "hf")
    values = write_bfloat16(fixture_tensors(), hf_dir / "model.safetensors")
    import_hf_bert(hf_dir, tmp_path / "run", say=quiet)
    model, _ = restored_masked_lm(tmp_path / "run")
    words = values["bert.embeddings.word_embeddings.weight"]
    ours = np.asarray(model.encoder.token_embedding.embeddings)
    np.testing.assert_array_equal(ours[hf_to_ours(tmp_path / "run")], words)


# --- errors: one line, nothing written ------------------------------------------------------

def drop(key):
    return lambda tensors: {k: v for k, v in tensors.items() if k != key}


def add(key, value):
    return lambda tensors: {**tensors, key: value}


def untie(tensors):
    return {**tensors, "cls.predictions.decoder.weight": tensors["bert.embeddings.word_embeddings.weight"] + 1}


def without_mask_token(vocab):
    return [token if token != "[MASK]" else "[unused100]" for token in vocab]


ERRORS = {
    "not bert": ({"config": {"model_type": "gpt2"}},
                 r"config.json: model_type 'gpt2' is not a BERT-family encoder \(supported: bert\)"),
    "activation": ({"config": {"hidden_act": "relu"}}, r"hidden_act 'relu' is not supported"),
    "epsilon": ({"config": {"layer_norm_eps": 1e-5}}, r"layer_norm_eps 1e-05 is not supported"),
    "relative positions": ({"config": {"position_embedding_type": "relative_key"}}, r"position_embedding_type"),
    "fewer layers": ({"config": {"num_hidden_layers": 1}},
                     r"'encoder.layer.1.attention.output.LayerNorm.bias' is not used"),
    "missing tensor": ({"tensors": drop("bert.encoder.layer.1.output.dense.bias")},
                       r"no tensor 'bert.encoder.layer.1.output.dense.bias'"),
    "unknown tensor": ({"tensors": add("bert.encoder.layer.0.attention.self.distance_embedding.weight",
                                       np.ones((4, 2), np.float32))},
                       r"'encoder.layer.0.attention.self.distance_embedding.weight' is not used"),
    "untied": ({"tensors": untie}, r"cls.predictions.decoder.weight differs from the word embeddings"),
    "vocab size": ({"vocab": lambda vocab: vocab[:-1]}, r"vocab.txt: 245 tokens, but config.json vocab_size is 246"),
    "vocab specials": ({"vocab": without_mask_token}, r"vocab.txt: has no special token \[MASK\]"),
    "pytorch only": ({"files": {"pytorch_model.bin": b"x"}, "tensors": None},
                     r"no model.safetensors \(pytorch_model.bin is not read: a pickle can run code\); "
                     r"convert it once with"),
    "no weights": ({"tensors": None}, r"no model.safetensors$"),
    "corrupt weights": ({"tensors": None, "files": {"model.safetensors": b"\x08" + bytes(20)}},
                        r"model.safetensors: not a readable safetensors file"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_unusable_checkpoints_are_refused_and_nothing_is_written(case, tmp_path):
    change, message = ERRORS[case]
    tensors = fixture_tensors()
    if "tensors" in change:
        tensors = change["tensors"](tensors) if change["tensors"] else None
    hf_dir = copy_fixture(tmp_path / "hf", tensors, change.get("config"))
    if "vocab" in change:
        (hf_dir / "vocab.txt").write_text("\n".join(change["vocab"](HF_VOCAB)) + "\n", encoding="utf-8")
    for name, data in change.get("files", {}).items():
        (hf_dir / name).write_bytes(data)
    with pytest.raises(UserError, match=message) as caught:
        import_hf_bert(hf_dir, tmp_path / "out" / "run", say=quiet)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_existing_run_dir_is_refused_and_left_alone(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"exists and is not empty; an import writes a new run"):
        import_hf_bert(FIXTURE, run_dir, say=quiet)
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"is a file, not a directory"):
        import_hf_bert(FIXTURE, tmp_path / "file", say=quiet)


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(UserError, match=r"no such directory"):
        import_hf_bert(tmp_path / "nowhere", tmp_path / "run", say=quiet)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty/config.json: no such file"):
        import_hf_bert(tmp_path / "empty", tmp_path / "run", say=quiet)
    assert not (tmp_path / "run").exists()


# --- through the command line ----------------------------------------------------------------

def test_import_then_predict_and_fine_tune_from_it(tmp_path):
    """The verbs users chain: import a BERT, poke it with [MASK], fine-tune a classifier on it."""
    from cli_helpers import in_process, trainformer

    imported = tmp_path / "imported"
    trainformer("import", "hf", str(FIXTURE), "--run-dir", str(imported))
    [line] = in_process("predict", str(imported), "我[MASK]你").stdout.splitlines()
    assert len(json.loads(line)["masks"][0]) == 5
    refused = trainformer("train", "--run-dir", str(imported), check=False)
    assert refused.returncode == 2 and "an imported checkpoint, not a training run" in refused.stderr

    # model.init_from alone: the encoder's sizes (post-LN, learned positions, exact GELU) are the import's
    result = trainformer("train", "--run-dir", str(tmp_path / "intent"),
                         "--set", "task.type=classify", "--set", "data.corpus=chatterbot-zh-intents",
                         "--set", "data.valid_fraction=0.1", "--set", "data.test_fraction=0.1",
                         "--set", "data.seq_len=32", "--set", "train.batch_size=16", "--set", "train.steps=5",
                         "--set", f"model.init_from={imported}")
    assert f"encoder: from {imported}/checkpoints/ckpt-0" in result.stdout
    source, tuned = (RunDir(path).load_config().model for path in (imported, tmp_path / "intent"))
    sizes = ("d_model", "num_layers", "num_heads", "dff", "norm", "position", "activation", "max_length")
    assert [getattr(tuned, key) for key in sizes] == [getattr(source, key) for key in sizes]
