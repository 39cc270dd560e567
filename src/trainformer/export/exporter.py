"""Write a run's model as deployable artifacts, each checked against the Keras model.

    BASE/<version>/                       one version, TF Serving's layout (export/versions.py)
        saved_model.pb, variables/, assets/   the SavedModel: serving_default (text in), serve_ids (ids in)
        model.tflite                      LiteRT, ids in (+ model_dynamic.tflite, model_float16.tflite)
        model.onnx                        onnxruntime, ids in
        vocab.txt, tokenizer.json, tokenizer.py   ids for the TFLite and ONNX models
        metadata.json                     run (name, path from the version), step, version, task, parity, ...

version = the checkpoint's step unless given. The artifacts are written into BASE/.<version>.partial
and renamed to BASE/<version> only when all of them are written and pass parity: a crash (or a
failed parity check) never leaves a half or a wrong version where a server would load it, and
never touches the versions already there. Seq2seq runs export the SavedModel only: their
answer is a search loop over the decoder, which TFLite and ONNX would not run as the graph does.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import tensorflow as tf

from trainformer.data.tokenizer import SETTINGS_FILE, VOCAB_FILE
from trainformer.errors import UserError
from trainformer.export import parity, versions
from trainformer.export.convert import QUANTIZATIONS, to_onnx, to_tflite
from trainformer.files import write_atomic
from trainformer.run.inference import load_run
from trainformer.run_dir import RunDir, now, package_versions
from trainformer.tokens import PAD_ID

FORMATS = ("saved_model", "tflite", "onnx")
TASK_FORMATS = {"classify": FORMATS, "mlm": FORMATS, "seq2seq": ("saved_model",)}
# Why seq2seq has no TFLite or ONNX: what `export --format tflite` of such a run says.
SEQ2SEQ_ONLY_SAVED_MODEL = ("its answer is the beam search looping over the decoder inside the graph, and no TFLite "
                            "or ONNX form of that loop is checked token for token against predict; use "
                            "--format saved_model")
METADATA_FILE = "metadata.json"
TOKENIZER_SCRIPT = Path(__file__).with_name("wordpiece_tokenizer.py")  # stdlib only: runs anywhere
VERSIONS = ("trainformer", "tensorflow", "tensorflow-text", "keras", "tf2onnx", "onnxruntime", "ai-edge-litert")


def export_run(run_dir: Path, out: Path | None = None, formats=None, which: str | None = None, quantize=(),
               say=print, version: int | None = None, keep: int | None = None, overrides=()) -> dict:
    """Export a run's latest or best checkpoint (None: load_run's choice) as version `version` (default: its step) of
    the export base `out` (default RUN_DIR/export); `keep` prunes all but the newest versions
    after it; `overrides` (decode.KEY=VALUE) decode a seq2seq run otherwise than it trained.
    formats=None: every format the task has. Returns the metadata written to metadata.json,
    parity figures included; a version that fails parity is not published (see above)."""
    run_dir = Path(run_dir)
    base = Path(out) if out else run_dir / "export"
    task_type = RunDir(run_dir).load_config().task.type
    formats = TASK_FORMATS.get(task_type, FORMATS) if formats is None else tuple(formats)
    _check_request(task_type, formats, quantize, version, keep, overrides)
    versions.check_base(base)
    task, model, checkpoint, step = load_run(run_dir, which, precision="fp32", overrides=overrides, say=say)
    version = step if version is None else version
    versions.check_version(base, version)
    serving = task.serving(model)
    staging = versions.staging(base, version)
    files = _write_artifacts(serving, run_dir / "tokenizer", staging, formats, quantize, say)
    _copy_tokenizer(run_dir / "tokenizer", staging)
    say("parity: every artifact against what trainformer answers, on held-out data")
    checked = parity.check(task, serving, staging, files)
    metadata = _metadata(task, serving, run_dir, base / str(version), checkpoint, step, version, files, checked)
    write_atomic(staging / METADATA_FILE, json.dumps(metadata, indent=2, ensure_ascii=False) + "\n")
    say("\n".join(parity.report_lines(checked)))
    if parity.failures(checked, tuple(quantize)):  # the caller says which and exits 1
        say(f"version {version} not published: it stays in {staging} (the next export of it replaces it)")
    else:
        _publish(staging, base, version, step, keep, say)
    return metadata


def _publish(staging: Path, base: Path, version: int, step: int, keep: int | None, say) -> None:
    """The checked version into BASE, where servers pick it up; then --keep's pruning."""
    folder = versions.publish(staging, base, version)
    say(f"exported step {step} as version {version}: {folder}")
    removed = versions.prune(base, keep, version) if keep else []
    if removed:
        say(f"removed version{'s' if len(removed) > 1 else ''} {', '.join(map(str, removed))} (--keep {keep})")


def _check_request(task_type: str, formats, quantize, version, keep, overrides) -> None:
    """Every refusal that needs no model: before minutes of loading and converting."""
    _check_choices("--format", formats, FORMATS)
    _check_choices("--quantize", quantize, QUANTIZATIONS)
    if quantize and "tflite" not in formats:
        raise UserError("--quantize makes quantized TFLite models: add tflite to --format")
    if task_type not in TASK_FORMATS:
        raise UserError(f"export: a {task_type} run; export handles {', '.join(TASK_FORMATS)} runs")
    refused = [name for name in formats if name not in TASK_FORMATS[task_type]]
    if refused:
        raise UserError(f"--format {','.join(refused)}: a {task_type} run exports as a SavedModel only: "
                        f"{SEQ2SEQ_ONLY_SAVED_MODEL}")
    for option, value in (("--version", version), ("--keep", keep)):
        if value is not None and value < 1:
            raise UserError(f"{option} {value}: must be a positive integer")
    for item in overrides:
        if not item.partition("=")[0].strip().startswith("decode."):
            raise UserError(f"--set {item}: export changes only how a seq2seq run decodes (decode.beam_size, "
                            f"decode.max_length, decode.strategy, decode.length_penalty)")
    if overrides and task_type != "seq2seq":
        raise UserError(f"--set {overrides[0]}: this is a {task_type} run; only seq2seq runs decode")


def _metadata(task, serving, run_dir: Path, folder: Path, checkpoint: str, step: int, version: int, files: dict,
              checked: dict) -> dict:
    """What metadata.json says about a version (paths relative to the version folder)."""
    metadata = {
        "task": task.config.task.type, **run_reference(run_dir, folder, checkpoint),
        "step": step, "version": version, "labels": getattr(task, "labels", None),
        "max_length": task.config.data.seq_len, "pad_id": PAD_ID, "vocab_size": task.tokenizer.vocab_size,
        "vocab_sha256": task.tokenizer.vocab_hash, "lowercase": task.tokenizer.lowercase, "files": files,
        "signatures": _describe(serving.exported_functions()),
    }
    if hasattr(task, "decode_settings"):
        metadata["decode"] = task.decode_settings()  # the run's, or as --set changed them
    return {**metadata, "parity": checked, "versions": package_versions(VERSIONS), "created_at": now()}


def run_reference(run_dir: Path, out: Path, checkpoint: str) -> dict:
    """The run an export came from, in terms that survive copying both elsewhere: its name
    (what `serve` calls the model), its path relative to the export and the checkpoint's
    relative to the run (absolute paths would name folders of the machine that exported it)."""
    run_dir = run_dir.resolve()
    return {"run": run_dir.name, "run_dir": os.path.relpath(run_dir, out.resolve()),
            "checkpoint": os.path.relpath(Path(checkpoint).resolve(), run_dir)}


def _check_choices(option: str, given, allowed) -> None:
    unknown = [value for value in given if value not in allowed]
    if unknown:
        raise UserError(f"{option}: unknown {', '.join(unknown)} (choose from {', '.join(allowed)})")


def _write_artifacts(serving, tokenizer_dir: Path, folder: Path, formats, quantize, say) -> dict[str, str]:
    """Each requested format into folder; returns artifact name -> file name. The SavedModel
    goes first, into the empty folder itself: TF Serving loads a version folder as it is."""
    files = {}

    def timed(name: str, file: str, write) -> None:
        started = time.perf_counter()
        write(folder / file)
        files[name] = file
        say(f"{name:15s} {folder.name.removeprefix('.').removesuffix('.partial')}/{file} "
            f"({time.perf_counter() - started:.1f}s)")

    if "saved_model" in formats:
        timed("saved_model", "saved_model.pb", lambda path: _save(serving, tokenizer_dir, path.parent))
    if "tflite" in formats:
        timed("tflite", "model.tflite", lambda path: to_tflite(serving, path))
        for quantization in quantize:
            timed(f"tflite_{quantization}", f"model_{quantization}.tflite",
                  lambda path, q=quantization: to_tflite(serving, path, q))
    if "onnx" in formats:
        timed("onnx", "model.onnx", lambda path: to_onnx(serving, path))
    return files


def _save(serving, tokenizer_dir: Path, folder: Path) -> None:
    """The SavedModel, its vocabulary in assets/. The graph holds the vocabulary already (the
    tokenizer's op is built from it); the asset is for whoever reads the version folder alone,
    as TF Serving users expect assets/ to hold what the model reads."""
    serving.vocabulary = tf.saved_model.Asset(str(tokenizer_dir / VOCAB_FILE))
    tf.saved_model.save(serving, str(folder), signatures=serving.exported_functions())


def _copy_tokenizer(tokenizer_dir: Path, folder: Path) -> None:
    for name in (VOCAB_FILE, SETTINGS_FILE):
        shutil.copyfile(tokenizer_dir / name, folder / name)
    shutil.copyfile(TOKENIZER_SCRIPT, folder / "tokenizer.py")


def _describe(signatures: dict) -> dict:
    """Each signature's inputs and outputs: dtype and shape (None: any size)."""
    def spec(tensor_spec) -> dict:
        return {"dtype": tensor_spec.dtype.name, "shape": tensor_spec.shape.as_list()}

    described = {}
    for name, function in signatures.items():
        concrete = function.get_concrete_function()
        described[name] = {"inputs": {s.name: spec(s) for s in function.input_signature},
                           "outputs": {key: spec(value) for key, value in sorted(concrete.structured_outputs.items())}}
    return described
