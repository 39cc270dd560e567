"""`trainformer diff RUN_A RUN_B`: what differs between two runs, most decisive first.

Reads only what a run directory records about itself (config.yaml, manifest.json,
metrics.jsonl, tokenizer/vocab.txt) and never imports TensorFlow, so it answers in well under
a second. The order is that of "why would these two runs end differently": the experiment
(config keys), the seed, the data, the vocabulary, the software, the hardware, the numerics,
the code revision, then what came out (final metrics, weights).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import yaml

from trainformer.errors import UserError
from trainformer.files import read_json, read_records
from trainformer.run_dir import RunDir

# Config keys shown in their own aspect, further down, rather than among the config keys.
SEED_KEY = "train.seed"
DEVICE_KEYS = ("train.strategy", "runtime.")
NUMERICS_KEYS = ("train.precision", "train.xla", "train.deterministic")
# Manifest keys the aspects read, or that repeat config.yaml (name, task) or metrics.jsonl
# (final_eval); any other key (an imported run's, a newer trainformer's) is compared at the end.
MANIFEST_KEYS = {"name", "task", "seed", "num_params", "vocab_size", "devices", "replicas", "data", "python",
                 "platform", "packages", "git_rev", "final_eval", "weights_sha256", "precision", "precision_reason"}
# Differ from run to run of the very same experiment: when, and how fast, not what was computed.
TIMING_KEYS = {"time", "started_at", "ended_at", "segments", "tokens_per_s", "examples_per_s", "data_wait_pct"}
HASH = re.compile(r"^([0-9a-f]{12})[0-9a-f]{28,}(\+dirty)?$")


def diff_runs(run_a: Path, run_b: Path) -> list[dict]:
    """The differences between two run directories, most decisive first: dicts with "what",
    "a" and "b" (None where a run does not record it), and "change" (b - a) for final metrics."""
    aspects_a, aspects_b = aspects(read_run(Path(run_a))), aspects(read_run(Path(run_b)))
    differences = []
    for (kind, a), (_, b) in zip(aspects_a, aspects_b):
        for what in [*a, *(key for key in b if key not in a)]:
            if a.get(what) != b.get(what):
                differences.append(difference(kind, what, a.get(what), b.get(what)))
    return differences


def difference(kind: str, what: str, a, b) -> dict:
    found = {"what": what, "a": a, "b": b}
    if kind == "result" and is_number(a) and is_number(b):
        found["change"] = b - a
    return found


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---------------------------------------------------------------- reading a run


def read_run(root: Path) -> dict:
    """The files a run records about itself, parsed; a folder that holds no run is a UserError."""
    run = RunDir(root)
    if not root.is_dir():
        raise UserError(f"{root}: not a run directory ({'a file' if root.exists() else 'no such directory'})")
    if not run.config_file.is_file():
        raise UserError(f"{root}: not a run directory (no config.yaml)")
    try:
        config = yaml.safe_load(run.config_file.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise UserError(f"{run.config_file}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise UserError(f"{run.config_file}: not a run config (a YAML mapping expected)")
    return {"config": config, "manifest": read_manifest(run.manifest_file),
            "metrics": read_records(run.metrics_file), "vocab": run.tokenizer_dir / "vocab.txt"}


def read_manifest(path: Path) -> dict:
    # a run stopped before its first step records no manifest yet
    return read_json(path) if path.is_file() else {}


# ---------------------------------------------------------------- what a run is, aspect by aspect


def aspects(run: dict) -> list[tuple[str, dict]]:
    """(kind, {what: value}) per aspect of a run, most decisive first; every run gives the
    same aspects in the same order, each with the keys it records."""
    config, manifest = flatten(run["config"]), run["manifest"]
    own_aspect = (SEED_KEY, *DEVICE_KEYS, *NUMERICS_KEYS)
    return [
        ("config", {key: value for key, value in config.items() if not key.startswith(own_aspect)}),
        ("seed", {"seed": config.get(SEED_KEY, manifest.get("seed"))}),
        ("data", data_aspect(manifest.get("data", {}))),
        ("vocabulary", {"vocabulary sha256": file_sha256(run["vocab"]), "vocabulary size": manifest.get("vocab_size"),
                        "model parameters": manifest.get("num_params")}),
        ("software", {"python": manifest.get("python"), **flatten(manifest.get("packages", {}), "package "),
                      "platform": manifest.get("platform")}),
        ("devices", {"devices": manifest.get("devices"), "replicas": manifest.get("replicas"),
                     **{key: value for key, value in config.items() if key.startswith(DEVICE_KEYS)}}),
        ("numerics", {**{key: config.get(key) for key in NUMERICS_KEYS},
                      "precision used": manifest.get("precision")}),  # what train.precision auto chose
        ("code", {"git revision": manifest.get("git_rev")}),
        ("result", {**final_metrics(run["metrics"]), "weights sha256": manifest.get("weights_sha256")}),
        ("other", flatten({key: value for key, value in manifest.items()
                           if key not in MANIFEST_KEYS | TIMING_KEYS}, "manifest ")),
    ]


def data_aspect(data: dict) -> dict:
    """The fingerprint first (it decides everything else), then skip counts, then the rest."""
    rest = {key: value for key, value in data.items() if key not in ("fingerprint", "skipped_lines")}
    return {"data fingerprint": data.get("fingerprint"),
            **flatten(data.get("skipped_lines", {}), "data skipped_lines."), **flatten(rest, "data ")}


def final_metrics(records: list[dict]) -> dict:
    """The last valid evaluation and the last training log line, without timing."""
    final = {}
    for split in ("valid", "train"):
        last = next((record for record in reversed(records) if record.get("split") == split), {})
        final.update({f"{split} {key}": value for key, value in last.items() if key not in TIMING_KEYS | {"split"}})
    return final


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"seed": 1}} -> {"train.seed": 1}, in the tree's own order."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def file_sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


# ---------------------------------------------------------------- formatting


def format_differences(differences: list[dict]) -> str:
    """One aligned line per difference ("what  a -> b (change)") and a count; or "no differences"."""
    if not differences:
        return "no differences"
    width = max(len(found["what"]) for found in differences)
    lines = []
    for found in differences:
        metric = "change" in found
        change = f" ({show_change(found['change'])})" if metric else ""
        lines.append(f"{found['what']:{width}s}  {show(found['a'], metric)} -> {show(found['b'], metric)}{change}")
    lines.append(f"{len(differences)} difference{'s' if len(differences) > 1 else ''}")
    return "\n".join(lines)


def show_change(change: float) -> str:
    return f"{change:+d}" if isinstance(change, int) else f"{change:+.4f}"


def show(value, metric: bool = False) -> str:
    """A value as a person reads it: config values as YAML writes them, metrics to 4 decimals,
    hashes and revisions shortened to 12 characters, '-' where a run does not record it."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and metric:
        return f"{value:.4f}"
    if isinstance(value, str):
        short = HASH.match(value)
        return "".join(part for part in short.groups() if part) if short else value or "''"
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return "; ".join(value)
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else str(value)
