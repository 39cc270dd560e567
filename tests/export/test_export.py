"""`trainformer export` end to end on real tiny runs: a classifier on the chatterbot intents and
a masked LM on the intents' texts, every artifact checked against the Keras model, the SavedModel
loaded in a fresh process without trainformer, the TFLite model fed by the exported tokenizer.py,
and the export base checked by TF Serving's own rule for version folders."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import ENV, in_process, trainformer

from trainformer import quiet
from trainformer.cli import main
from trainformer.errors import UserError
from trainformer.export import export_run, exporter, versions
from trainformer.export.convert import to_tflite
from trainformer.export.parity import FLOAT32_TOLERANCE, failures

TEXTS = ["你好", "你喜欢看什么电影？", "我们来聊聊历史吧，" * 8, "Who are you?"]  # the third is over 32 tokens

# Run in a fresh interpreter: only tensorflow and tensorflow-text, as on a serving host.
FRESH_PROCESS = """
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the tokenizer's ops
model = tf.saved_model.load(sys.argv[1])
answer = model.signatures["serving_default"](text=tf.constant(json.loads(sys.argv[2])))
assert not [name for name in sys.modules if name.startswith("trainformer")]
print(json.dumps({key: value.numpy().tolist() for key, value in answer.items()}, default=bytes.decode))
"""


def served_versions(base: Path) -> list[int]:
    """TF Serving's rule (file_system_storage_path_source): a child folder of the model base path
    whose whole name is a non-negative integer is a version; anything else is ignored."""
    return sorted(int(child.name) for child in base.iterdir() if child.is_dir() and child.name.isdigit())


def assert_tf_serving_loads(base: Path) -> None:
    """Every version a loadable SavedModel with serving_default, its vocabulary in assets/."""
    import tensorflow as tf

    for version in served_versions(base):
        folder = base / str(version)
        assert "serving_default" in tf.saved_model.load(str(folder)).signatures, folder
        assert (folder / "assets" / "vocab.txt").read_text() == (folder / "vocab.txt").read_text()


def test_classify_export_matches_the_keras_model_everywhere(intent_export):
    run_dir, base, stdout, out = intent_export
    assert served_versions(base) == [20] and out == base / "20"  # version = the checkpoint's step
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["task"] == "classify" and metadata["step"] == metadata["version"] == 20
    assert metadata["labels"] == json.loads((run_dir / "labels.json").read_text())
    rows = metadata["parity"]["artifacts"]
    assert set(rows) == {"keras", "saved_model", "tflite", "tflite_dynamic", "tflite_float16", "onnx"}
    for name in ("saved_model", "tflite", "onnx"):
        assert rows[name]["max_abs_logit_diff"] <= 1e-4 and rows[name]["agreement"] == 1.0, name
        assert rows[name]["accuracy"] == rows["keras"]["accuracy"]
    # Other runtimes, other kernels: a real, small difference. Exactly 0 would mean the check
    # compared the Keras model with itself (the perturbed artifact below shows it measures).
    assert rows["keras"]["max_abs_logit_diff"] == 0.0
    for name in ("tflite", "onnx"):
        assert 0 < rows[name]["max_abs_logit_diff"] <= 1e-5, name
    assert 0 < rows["tflite_dynamic"]["max_abs_logit_diff"]  # quantized: reported, not required equal
    assert metadata["parity"]["examples"] > 0 and metadata["parity"]["text_max_abs_diff"] <= 1e-5
    assert "tflite_float16" in stdout and "same answer" in stdout
    signatures = metadata["signatures"]
    assert signatures["serving_default"]["inputs"] == {"text": {"dtype": "string", "shape": [None]}}
    assert set(signatures["serving_default"]["outputs"]) == {"label", "label_ids", "logits", "probabilities",
                                                             "truncated"}
    assert signatures["serve_ids"]["inputs"] == {"token_ids": {"dtype": "int32", "shape": [None, None]}}


def test_the_saved_model_answers_text_in_a_fresh_process_as_predict_does(intent_export):
    run_dir, _, _, out = intent_export
    answer = json.loads(subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(out),
                                        json.dumps(TEXTS)], capture_output=True, text=True, env=ENV,
                                       check=True).stdout)
    predicted = [json.loads(line) for line in in_process("predict", str(run_dir), *TEXTS).stdout.splitlines()]
    assert answer["label"] == [p["label"] for p in predicted]
    for row, p in zip(answer["probabilities"], predicted):
        assert np.allclose(row, list(p["probabilities"].values()), atol=1e-5)
    assert answer["truncated"] == [False, False, True, False]  # the third is cut at data.seq_len=32

    listing = subprocess.run([str(Path(sys.executable).with_name("saved_model_cli")), "show", "--dir",
                              str(out), "--all"], capture_output=True, text=True, env=ENV).stdout
    assert "signature_def['serving_default']" in listing and "signature_def['serve_ids']" in listing
    assert "dtype: DT_STRING" in listing and "dtype: DT_INT32" in listing


def test_tflite_and_onnx_answer_from_the_exported_tokenizer(intent_export):
    out = intent_export.version_dir
    sys.path.insert(0, str(out))
    try:
        from tokenizer import WordPieceTokenizer  # the export's own copy: no trainformer needed
    finally:
        sys.path.remove(str(out))
    metadata = json.loads((out / "metadata.json").read_text())
    token_ids, truncated = WordPieceTokenizer.from_files(out).encode_batch(TEXTS, metadata["max_length"])
    token_ids = np.array(token_ids, np.int32)

    import onnxruntime
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    reference = tf.saved_model.load(str(out)).signatures["serving_default"](text=tf.constant(TEXTS))
    lite = Interpreter(model_path=str(out / "model.tflite")).get_signature_runner()(token_ids=token_ids)
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    onnx = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"token_ids": token_ids})))
    for logits in (lite["logits"], onnx["logits"]):
        assert np.abs(logits - reference["logits"].numpy()).max() <= 1e-4
        assert [metadata["labels"][i] for i in logits.argmax(-1)] == [t.decode() for t in reference["label"].numpy()]
    assert truncated == reference["truncated"].numpy().tolist()


def test_a_masked_lm_exports_fill_mask(tmp_path, intent_pretraining):
    run_dir = intent_pretraining
    base = tmp_path / "fill-mask"
    metadata = export_run(run_dir, base, formats=("saved_model", "tflite"), say=lambda text: None)
    for name in ("saved_model", "tflite"):
        assert metadata["parity"]["artifacts"][name]["max_abs_logit_diff"] <= 1e-4
    assert set(metadata["signatures"]["serve_ids"]["inputs"]) == {"token_ids", "masked_positions"}
    texts = ["今天[MASK]气很好，[MASK]民日报", "没有掩码"]
    answer = json.loads(subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(base / "20"),
                                        json.dumps(texts)], capture_output=True, text=True, env=ENV,
                                       check=True).stdout)
    assert answer["mask_count"] == [2, 0]
    assert np.array(answer["tokens"]).shape == (2, 2, 5) and answer["tokens"][1] == [[""] * 5] * 2
    predicted = json.loads(in_process("predict", str(run_dir), texts[0]).stdout)
    assert [[c["token"] for c in mask] for mask in predicted["masks"]] == answer["tokens"][0]


def test_bad_export_requests_are_one_line_errors_that_keep_what_exists(intent_export, tmp_path):
    run_dir, base = intent_export.run_dir, intent_export.base
    with pytest.raises(UserError, match="--format: unknown pb"):
        export_run(run_dir, tmp_path / "a", formats=("pb",))
    with pytest.raises(UserError, match="add tflite to --format"):
        export_run(run_dir, tmp_path / "b", formats=("onnx",), quantize=("dynamic",))
    with pytest.raises(UserError, match="--version 0: must be a positive integer"):
        export_run(run_dir, tmp_path / "c", version=0)
    with pytest.raises(UserError, match="only seq2seq runs decode"):
        export_run(run_dir, tmp_path / "d", overrides=["decode.beam_size=2"])
    precious = tmp_path / "notes"
    precious.mkdir()
    (precious / "todo.txt").write_text("keep me")
    with pytest.raises(UserError, match="holds todo.txt besides export versions"):
        export_run(run_dir, precious)
    assert (precious / "todo.txt").read_text() == "keep me"
    old = tmp_path / "old-export"
    (old / "saved_model").mkdir(parents=True)
    (old / "metadata.json").write_text("{}")
    with pytest.raises(UserError, match=r"old layout \(metadata.json, saved_model at its top\)"):
        export_run(run_dir, old)
    with pytest.raises(UserError, match="is itself a SavedModel"):
        export_run(run_dir, base / "20")
    with pytest.raises(UserError, match="version 20 exists and versions are never replaced"):
        export_run(run_dir, base, formats=("saved_model",))
    assert served_versions(base) == [20] and not [p for p in base.iterdir() if p.name != "20"]
    for args in (["export", str(tmp_path / "no-run")], ["export", str(run_dir), "--out", str(old)]):
        result = trainformer(*args, check=False)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


def test_versions_accumulate_under_the_base_as_tf_serving_loads_them(intent_export, tmp_path, monkeypatch):
    """A second export adds a version beside the first, appearing only whole (written under a
    name TF Serving ignores, then renamed); --keep removes the oldest; every version left is a
    SavedModel TF Serving would load, the highest the one it serves."""
    base = tmp_path / "intent"
    shutil.copytree(intent_export.base, base)  # the shared export stays as it is
    shutil.copytree(base / "20", base / "3")  # an older version (a copy will do)
    seen = {}

    def publish(folder, base_path, version):
        seen.update(name=folder.name, versions=served_versions(base_path),
                    files=sorted(p.name for p in folder.iterdir()))
        return real_publish(folder, base_path, version)

    real_publish = versions.publish
    monkeypatch.setattr(versions, "publish", publish)
    monkeypatch.setitem(quiet._state, "debug", False)  # --debug: no stderr filter inside pytest
    assert main(["export", str(intent_export.run_dir), "--out", str(base), "--format", "saved_model",
                 "--version", "25", "--keep", "2", "--debug"]) == 0
    assert seen["name"] == ".25.partial" and not seen["name"].isdigit()
    assert seen["versions"] == [3, 20]  # complete (metadata.json written last) yet not a version yet
    assert {"saved_model.pb", "variables", "assets", "metadata.json"} <= set(seen["files"])
    assert served_versions(base) == [20, 25] and sorted(p.name for p in base.iterdir()) == ["20", "25"]
    assert max(served_versions(base)) == 25  # what TF Serving serves
    assert json.loads((base / "25" / "metadata.json").read_text())["version"] == 25
    assert_tf_serving_loads(base)


def test_export_exits_1_on_an_artifact_whose_weights_are_off(intent_export, tmp_path, monkeypatch, capsys):
    """A TFLite model converted with the logits bias moved by 0.01: every answer the same, every
    logit 0.01 off. Parity measures exactly that and `export` names the artifact and exits 1."""
    run_dir = intent_export.run_dir

    def off_by_a_hundredth(serving, path, quantization=None):
        bias = next(v for v in serving.model.weights if v.path.endswith("logits/bias"))
        kept = bias.numpy()
        bias.assign(kept + 0.01)  # frozen into the TFLite model's constants
        try:
            to_tflite(serving, path, quantization)
        finally:
            bias.assign(kept)  # the Keras model parity compares with is the run's own

    monkeypatch.setattr(exporter, "to_tflite", off_by_a_hundredth)
    monkeypatch.setitem(quiet._state, "debug", False)  # --debug: no stderr filter inside pytest
    base = tmp_path / "off"
    assert main(["export", str(run_dir), "--out", str(base), "--format", "saved_model,tflite", "--debug"]) == 1
    assert served_versions(base) == []  # a model that fails parity is never where a server would load it
    rows = json.loads((base / ".20.partial" / "metadata.json").read_text())["parity"]["artifacts"]
    assert rows["tflite"]["max_abs_logit_diff"] == pytest.approx(0.01, abs=FLOAT32_TOLERANCE)
    assert rows["tflite"]["agreement"] == 1.0 and rows["saved_model"]["max_abs_logit_diff"] <= FLOAT32_TOLERANCE
    assert capsys.readouterr().err.splitlines() == [
        f"trainformer: parity failed: tflite: max |logit difference| {rows['tflite']['max_abs_logit_diff']:.2e}, "
        "100.00% same predictions"]


def test_parity_fails_an_unquantized_artifact_that_is_off_or_answers_differently():
    row = {"max_abs_logit_diff": 0.0, "agreement": 1.0, "accuracy": 0.5}
    parity = {"artifacts": {"keras": row, "saved_model": row,
                            "onnx": {**row, "max_abs_logit_diff": 2e-4},
                            "tflite": {**row, "max_abs_logit_diff": 1e-6, "agreement": 0.99},
                            "tflite_dynamic": {**row, "max_abs_logit_diff": 3e-2, "agreement": 0.9}}}
    problems = failures(parity, quantized=("dynamic",))
    assert [line.split(":")[0] for line in problems] == ["onnx", "tflite"]
