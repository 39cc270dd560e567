"""A seq2seq run exported end to end: a tiny English -> Chinese translation model trained on the
real LibreOffice help, exported as a text-in SavedModel whose beam search answers, in a fresh
process without trainformer, what `trainformer predict` prints, n-best included."""

import json
import shutil
import subprocess
import sys

import pytest
from cli_helpers import ENV, in_process, trainformer

from trainformer.errors import UserError
from trainformer.export import export_run

# conftest's translation_export: cli_helpers.TRANSLATION trained 20 steps and exported
SOURCES = ["Click the OK button.", "To Create a Variable", "Select the cells " * 20]  # the last is truncated

# Only tensorflow and tensorflow-text, as on a serving host.
FRESH_PROCESS = """
import json, sys
import tensorflow as tf
import tensorflow_text  # registers the tokenizer's ops
model = tf.saved_model.load(sys.argv[1])
answer = model.signatures["serving_default"](text=tf.constant(json.loads(sys.argv[2])))
assert not [name for name in sys.modules if name.startswith("trainformer")]
print(json.dumps({key: value.numpy().tolist() for key, value in answer.items()}, default=bytes.decode))
"""


def test_a_translation_run_exports_a_text_in_saved_model_that_answers_as_predict(translation_export):
    run_dir, base, stdout = translation_export
    version = base / "20"
    assert sorted(p.name for p in base.iterdir()) == ["20"] and (version / "saved_model.pb").is_file()
    metadata = json.loads((version / "metadata.json").read_text())
    assert metadata["task"] == "seq2seq" and metadata["version"] == 20 and set(metadata["files"]) == {"saved_model"}
    assert metadata["decode"] == {"strategy": "beam", "max_length": 48, "beam_size": 2, "length_penalty": 1.0}
    parity = metadata["parity"]
    assert parity["examples"] == 64 and parity["split"] == "valid" and parity["against"] == "predict"
    assert parity["artifacts"]["saved_model"] == {"same_output": 1.0, "same_nbest": 1.0, "max_abs_score_diff": 0.0}
    assert "same n-best" in stdout and "64 valid sources" in stdout
    outputs = metadata["signatures"]["serving_default"]["outputs"]
    assert metadata["signatures"]["serving_default"]["inputs"] == {"text": {"dtype": "string", "shape": [None]}}
    assert set(outputs) == {"output", "output_ids", "score", "outputs", "scores", "truncated"}

    answer = json.loads(subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(version), json.dumps(SOURCES)],
                                       capture_output=True, text=True, env=ENV, check=True).stdout)
    predicted = [json.loads(line) for line in
                 in_process("predict", str(run_dir), *SOURCES, "--nbest").stdout.splitlines()]
    assert answer["output"] == [p["output"] for p in predicted] and any(answer["output"])
    assert answer["score"] == pytest.approx([p["score"] for p in predicted], abs=1e-4)  # predict rounds to 4
    assert answer["outputs"] == [[h["output"] for h in p["nbest"]] for p in predicted]
    assert answer["truncated"] == [False, False, True] == [p.get("truncated", False) for p in predicted]


def test_export_decodes_as_set_and_refuses_what_it_cannot_check(translation_export, tmp_path):
    run_dir, shared, _ = translation_export
    base = tmp_path / "export"
    shutil.copytree(shared, base)  # conftest's export is read-only: the new version goes to a copy
    metadata = export_run(run_dir, base, version=21, overrides=["decode.beam_size=3", "decode.max_length=12"],
                          say=lambda text: None)
    assert metadata["decode"] == {"strategy": "beam", "max_length": 12, "beam_size": 3, "length_penalty": 1.0}
    assert metadata["signatures"]["serving_default"]["outputs"]["scores"]["shape"] == [None, 3]
    assert metadata["parity"]["artifacts"]["saved_model"]["same_nbest"] == 1.0
    assert sorted(p.name for p in base.iterdir()) == ["20", "21"]  # the first version kept
    for formats in (("tflite",), ("saved_model", "onnx")):
        with pytest.raises(UserError, match="a seq2seq run exports as a SavedModel only"):
            export_run(run_dir, base, formats=formats)
    with pytest.raises(UserError, match="--set model.d_model=8: export changes only how a seq2seq run decodes"):
        export_run(run_dir, base, overrides=["model.d_model=8"])
