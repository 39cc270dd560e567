"""The run directory contract (DESIGN.md): paths, the resolved config, the manifest."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path

import yaml

from trainformer.config import ExperimentConfig, load_config
from trainformer.errors import UserError
from trainformer.files import write_atomic

# Keys that may change when a run is resumed: they extend or re-pace the run without changing
# what any finished step computed. Everything else must match the run's config.yaml.
RESUMABLE_CHANGES = {
    "train.steps", "train.log_every", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
    "train.attention_layer",  # only what TensorBoard draws
    "train.on_nan", "train.strategy", "runtime.memory_growth", "runtime.cpu_devices",  # e.g. resume on other hardware
}
PACKAGES = ("trainformer", "tensorflow", "tensorflow-text", "keras", "tokenizers", "numpy", "tensorboard", "snownlp")


@dataclasses.dataclass(frozen=True)
class RunDir:
    root: Path

    config_file = property(lambda self: self.root / "config.yaml")
    manifest_file = property(lambda self: self.root / "manifest.json")
    tokenizer_dir = property(lambda self: self.root / "tokenizer")
    checkpoints_dir = property(lambda self: self.root / "checkpoints")
    logs_dir = property(lambda self: self.root / "logs")
    metrics_file = property(lambda self: self.root / "metrics.jsonl")
    cache_dir = property(lambda self: self.root / "cache")

    def prepare(self, config: ExperimentConfig) -> bool:
        """Create the run directory for config, or check that an existing one ran the same
        experiment. Returns True when the directory already held a run."""
        if self.config_file.is_file():
            previous = yaml.safe_load(self.config_file.read_text(encoding="utf-8"))
            for key, (old, new) in _differences(previous, config.to_dict()).items():
                if key not in RESUMABLE_CHANGES:
                    raise UserError(
                        f"{self.config_file}: {key} was {old!r} in this run, now {new!r}; "
                        f"resume with the same config or pass a new --run-dir"
                    )
            existed = True
        else:
            existed = False
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config_file, yaml.safe_dump(config.to_dict(), sort_keys=False, allow_unicode=True))
        return existed

    def load_config(self) -> ExperimentConfig:
        if not self.config_file.is_file():
            raise UserError(f"{self.root}: not a run directory (no config.yaml)")
        return load_config(str(self.config_file))

    def read_manifest(self) -> dict:
        return json.loads(self.manifest_file.read_text()) if self.manifest_file.is_file() else {}

    def write_manifest(self, manifest: dict) -> None:
        write_atomic(self.manifest_file, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def _differences(old: dict, new: dict, prefix: str = "") -> dict[str, tuple]:
    keys = set(old) | set(new)
    found = {}
    for key in sorted(keys):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found.update(_differences(a, b, f"{prefix}{key}."))
        elif a != b and key != "name":
            found[f"{prefix}{key}"] = (a, b)
    return found


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision() -> str | None:
    """The commit of the trainformer source, when it runs from a git checkout."""
    source = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode:
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment() -> dict:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "git_rev": git_revision(),
    }
