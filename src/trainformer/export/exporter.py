"""Write a run's model as deployable artifacts, each checked against the Keras model.

    OUT/saved_model/        TF Serving: serving_default (text in) and serve_ids (ids in)
    OUT/model.tflite        LiteRT, ids in (+ model_dynamic.tflite, model_float16.tflite)
    OUT/model.onnx          onnxruntime, ids in
    OUT/vocab.txt, tokenizer.json, tokenizer.py   ids for the TFLite and ONNX models
    OUT/metadata.json       run (name, path from OUT), step, task, labels, vocabulary hash, versions, parity

The artifacts are written into a staging folder next to OUT that replaces OUT only when all
of them are written and checked: a crash never leaves a half export, and never loses the
previous one.
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
from trainformer.export import parity
from trainformer.export.convert import QUANTIZATIONS, to_onnx, to_tflite
from trainformer.files import write_atomic
from trainformer.run.inference import load_run
from trainformer.run_dir import RunDir, now, package_versions
from trainformer.tokens import PAD_ID

FORMATS = ("saved_model", "tflite", "onnx")
EXPORTABLE = ("classify", "mlm")  # seq2seq's parity (output ids, not logits) is not written yet
METADATA_FILE = "metadata.json"
TOKENIZER_SCRIPT = Path(__file__).with_name("wordpiece_tokenizer.py")  # stdlib only: runs anywhere
VERSIONS = ("trainformer", "tensorflow", "tensorflow-text", "keras", "tf2onnx", "onnxruntime", "ai-edge-litert")


def export_run(run_dir: Path, out: Path | None = None, formats=FORMATS, which: str = "latest",
               quantize=(), say=print) -> dict:
    """Export a run's latest or best checkpoint into out (default RUN_DIR/export); returns
    the metadata written to out/metadata.json, parity figures included."""
    _check_choices("--format", formats, FORMATS)
    _check_choices("--quantize", quantize, QUANTIZATIONS)
    if quantize and "tflite" not in formats:
        raise UserError("--quantize makes quantized TFLite models: add tflite to --format")
    out = Path(out) if out else Path(run_dir) / "export"
    _check_out(out)
    task_type = RunDir(Path(run_dir)).load_config().task.type
    if task_type not in EXPORTABLE:
        raise UserError(f"export: {run_dir} is a {task_type} run; export handles {' and '.join(EXPORTABLE)} runs "
                        f"(use trainformer predict for its answers)")
    task, model, checkpoint, step = load_run(Path(run_dir), which, precision="fp32")
    serving = task.serving(model)
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)  # a crashed export's leftovers
    staging.mkdir(parents=True)
    files = _write_artifacts(serving, staging, formats, quantize, say)
    _copy_tokenizer(Path(run_dir) / "tokenizer", staging)
    say("parity: every artifact against the Keras model on held-out data")
    checked = parity.check(task, serving, staging, files)
    metadata = {
        "task": task.config.task.type, **run_reference(Path(run_dir), out, checkpoint),
        "step": step, "labels": getattr(task, "labels", None), "max_length": task.config.data.seq_len,
        "pad_id": PAD_ID, "vocab_size": task.tokenizer.vocab_size, "vocab_sha256": task.tokenizer.vocab_hash,
        "lowercase": task.tokenizer.lowercase, "files": files, "signatures": _describe(serving.exported_functions()),
        "parity": checked, "versions": package_versions(VERSIONS), "created_at": now(),
    }
    write_atomic(staging / METADATA_FILE, json.dumps(metadata, indent=2, ensure_ascii=False) + "\n")
    _replace(out, staging)
    say("\n".join(parity.report_lines(checked)))
    say(f"exported step {step} to {out}")
    return metadata


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


def _check_out(out: Path) -> None:
    """OUT may be new, empty, or an earlier export (replaced): never anything else."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / METADATA_FILE).is_file())):
        raise UserError(f"--out {out}: exists and is not a trainformer export; choose a new or empty directory")


def _write_artifacts(serving, folder: Path, formats, quantize, say) -> dict[str, str]:
    """Each requested format into folder; returns artifact name -> file name."""
    files = {}

    def timed(name: str, file: str, write) -> None:
        started = time.perf_counter()
        write(folder / file)
        files[name] = file
        say(f"{name:15s} {folder.name.removeprefix('.').removesuffix('.partial')}/{file} "
            f"({time.perf_counter() - started:.1f}s)")

    if "saved_model" in formats:
        timed("saved_model", "saved_model", lambda path: tf.saved_model.save(serving, str(path),
                                                                             signatures=serving.exported_functions()))
    if "tflite" in formats:
        timed("tflite", "model.tflite", lambda path: to_tflite(serving, path))
        for quantization in quantize:
            timed(f"tflite_{quantization}", f"model_{quantization}.tflite",
                  lambda path, q=quantization: to_tflite(serving, path, q))
    if "onnx" in formats:
        timed("onnx", "model.onnx", lambda path: to_onnx(serving, path))
    return files


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


def _replace(out: Path, staging: Path) -> None:
    """staging becomes out; an earlier export is moved aside first and removed last."""
    old = out.with_name(f".{out.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
