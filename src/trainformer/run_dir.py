"""The run directory contract (DESIGN.md): paths, the resolved config, the manifest."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Collection
from pathlib import Path

import yaml

from trainformer.config import DEFAULT_CONFIG, ExperimentConfig, load_config, load_config_naming, teachers, validate
from trainformer.errors import UserError
from trainformer.files import write_atomic

# Keys that may change when a run is resumed: they extend or re-pace the run without changing
# what any finished step computed. Everything else must match the run's config.yaml.
RESUMABLE_CHANGES = {
    "train.steps", "train.minutes", "train.log_every", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
    "train.attention_layer",  # only what TensorBoard draws
    "train.on_nan", "train.strategy", "runtime.memory_growth", "runtime.cpu_devices",  # e.g. resume on other hardware
    "model.decoder_init",  # only how a new run starts: a resumed one has its decoder in its checkpoint
}
# The encoder's shape: a run started from another (model.init_from) takes these from it where
# its config leaves them out, and must match it on those it names (max_length too, for learned
# positions). Dropout is not a shape: a fine-tune chooses its own.
ENCODER_KEYS = ("d_model", "num_layers", "num_heads", "dff", "norm", "position", "activation", "ngram_buckets",
                "use_bias", "glu")
# What decides the vocabulary: a run that changes them before its first checkpoint trains a new one.
VOCABULARY_KEYS = ("data.corpus", "data.valid_fraction", "data.test_fraction", "tokenizer.", "model.init_from")
PACKAGES = ("trainformer", "tensorflow", "tensorflow-text", "keras", "tokenizers", "numpy", "tensorboard", "snownlp")


def no_checkpoint_yet(root: Path) -> UserError:
    return UserError(f"{root}: no checkpoint yet (the first is saved after train.checkpoint_every steps)")


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
    scores_file = property(lambda self: self.root / "eval" / "scores.jsonl")  # one line per `trainformer eval`

    lock_file = property(lambda self: self.root / ".lock")

    def has_checkpoint(self) -> bool:
        """A run exists once it has a checkpoint; before that a new config may replace it."""
        return (self.checkpoints_dir / "checkpoint").is_file()

    def require_checkpoint(self) -> None:
        """Refuse a run that has not saved a checkpoint yet: nothing to evaluate or export."""
        if not self.has_checkpoint():
            raise no_checkpoint_yet(self.root)

    def resume_command(self) -> str:
        return f"trainformer train --run-dir {self.root}"

    def check_usable(self) -> None:
        """Refuse a path that is a file, or a folder of other files that is not a run."""
        if self.root.exists() and not self.root.is_dir():
            raise UserError(f"--run-dir {self.root}: is a file, not a directory")
        if self.root.is_dir() and not self.config_file.is_file():
            others = sorted(p.name for p in self.root.iterdir() if p != self.lock_file)
            if others:
                raise UserError(f"--run-dir {self.root}: holds other files ({', '.join(others[:3])}"
                                f"{', ...' if len(others) > 3 else ''}) but no run; pass a new or empty directory")

    def check_resume(self, config: ExperimentConfig) -> None:
        """A run with a checkpoint resumes only with its own config, bar RESUMABLE_CHANGES."""
        if not self.has_checkpoint() or not self.config_file.is_file():
            return
        manifest = self.read_manifest()
        if manifest.get("imported_from") or manifest.get("averaged"):
            what = "an imported checkpoint" if manifest.get("imported_from") else "an average of checkpoints"
            raise UserError(f"{self.root}: {what}, not a training run; start a run from it: "
                            f"trainformer train CONFIG --set model.init_from={self.root}")
        for key, (old, new) in self.differences(config).items():
            if key not in RESUMABLE_CHANGES:
                raise UserError(
                    f"{self.config_file}: {key} was {old!r} in this run, now {new!r}; to resume the run as it "
                    f"was: {self.resume_command()} [--set train.steps=N]; to start another, pass a new --run-dir"
                )

    def check_same_data(self, source: str, fingerprint: str, documents: int) -> None:
        """The data a run trains on is part of the run: a corpus changed under it is refused."""
        data = self.read_manifest().get("data", {}) if self.has_checkpoint() else {}
        if data and data.get("fingerprint") != fingerprint:
            before = data.get("examples", data.get("train_documents", 0) + data.get("valid_documents", 0))
            raise UserError(
                f"data.corpus: {source} has changed since this run trained on it ({before:,} -> {documents:,} "
                f"documents, fingerprint {data.get('fingerprint', '?')[:12]} -> {fingerprint[:12]}); a run "
                f"trains on one corpus: restore it, or start a new run with another --run-dir"
            )

    def check_teachers(self, config: ExperimentConfig, fingerprint: str, labels: list[str]) -> None:
        """train.distill_from's runs: classifiers with a checkpoint, fine-tuned on this run's
        split (a teacher that trained on its valid or test texts would leak them into its
        answers) and with its labels."""
        for teacher in map(RunDir, map(Path, teachers(config))):
            if not teacher.config_file.is_file() or not teacher.has_checkpoint():
                raise UserError(f"train.distill_from: {teacher.root}: not a run with a checkpoint (fine-tune a "
                                f"classifier there first)")
            kind = teacher.load_config().task.type
            if kind != "classify":
                raise UserError(f"train.distill_from: {teacher.root} is a {kind} run; a teacher is a classify run")
            data = teacher.read_manifest().get("data", {})
            if data.get("fingerprint") != fingerprint:
                raise UserError(f"train.distill_from: {teacher.root} was fine-tuned on other data (fingerprint "
                                f"{str(data.get('fingerprint'))[:12]}) than this run's ({fingerprint[:12]}): it may "
                                f"have trained on texts this run validates and tests on; teach with runs of the same "
                                f"data.corpus, valid_fraction and test_fraction")
            if sorted(data.get("labels", [])) != sorted(labels):
                raise UserError(f"train.distill_from: {teacher.root} answers with the labels {data.get('labels')}, "
                                f"this run's are {labels}")

    def check_init_from(self, config: ExperimentConfig) -> None:
        """This run's config against the run it would start from (model.init_from): the
        encoder's shapes must match (inherit_encoder took those the config leaves out), the
        vocabulary is that run's, and a seq2seq decoder started from the encoder has a block
        of it for each of its own."""
        if not config.model.init_from:
            return
        source = RunDir(Path(config.model.init_from))
        if not source.config_file.is_file() or not (source.checkpoints_dir / "checkpoint").is_file():
            raise UserError(f"model.init_from: {source.root}: not a run with a checkpoint (train one, or import "
                            f"a BERT with: trainformer import hf HF_DIR --run-dir DIR)")
        if config.tokenizer.vocab_file:
            raise UserError("tokenizer.vocab_file: leave it empty with model.init_from: the run starts from "
                            f"{source.root}'s vocabulary")
        pretrained = source.load_config()
        for key in ENCODER_KEYS:
            ours, theirs = getattr(config.model, key), getattr(pretrained.model, key)
            if ours != theirs:
                raise UserError(f"model.{key}: {ours!r} here but {theirs!r} in model.init_from={source.root}; "
                                f"leave it out to take the source's")
        if config.model.position == "learned" and positions(config) != positions(pretrained):
            raise UserError(f"model.max_length: {positions(config)} positions here but {positions(pretrained)} in "
                            f"model.init_from={source.root}; leave it out to take the source's")
        check_same_split(config, pretrained, source.root)
        check_decoder_init(config, source.root)

    def differences(self, config: ExperimentConfig) -> dict[str, tuple]:
        """config's keys that differ from this run's. A key added to trainformer after the run
        was written counts as its default, the behaviour the run trained with: without that, no
        run from before a new key could resume."""
        return _differences(self.load_config().to_dict(), config.to_dict())

    @contextlib.contextmanager
    def lock(self):
        """Hold the run directory for this process (flock: the OS releases it if the process
        dies), so two trainings never write one run. The holder's pid is in the lock file. A
        directory made here that holds nothing else at the end is removed again."""
        created = not self.root.exists()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            handle = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise UserError(f"--run-dir {self.root}: cannot be created ({err.strerror})") from None
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(handle, 32, 0).decode(errors="replace").strip() or "?"
                raise UserError(f"{self.root}: another trainformer train is running on this run directory "
                                f"(pid {holder}); wait for it to end, or stop it first") from None
            os.ftruncate(handle, 0)
            os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            if created and [p.name for p in self.root.iterdir()] == [self.lock_file.name]:
                self.lock_file.unlink()  # a run that failed before writing anything leaves nothing
                self.root.rmdir()
            os.close(handle)  # releases the lock

    def prepare(self, config: ExperimentConfig) -> None:
        """Write config.yaml. A run without a checkpoint is not a run yet (an earlier attempt
        failed or was killed early): what it wrote is cleared for this config, and its
        vocabulary kept only if the config would train the same one."""
        if self.config_file.is_file() and not self.has_checkpoint():
            changed = self.differences(config)
            if any(key.startswith(VOCABULARY_KEYS) for key in changed):
                shutil.rmtree(self.tokenizer_dir, ignore_errors=True)
            for stale in (self.metrics_file, self.manifest_file):
                stale.unlink(missing_ok=True)
            shutil.rmtree(self.logs_dir, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_config(config)

    def write_config(self, config: ExperimentConfig) -> None:
        write_atomic(self.config_file, yaml.safe_dump(config.to_dict(), sort_keys=False, allow_unicode=True))

    def load_config(self) -> ExperimentConfig:
        if not self.config_file.is_file():
            raise UserError(f"{self.root}: not a run directory (no config.yaml)")
        return load_config(str(self.config_file))

    def read_manifest(self) -> dict:
        return json.loads(self.manifest_file.read_text()) if self.manifest_file.is_file() else {}

    def write_manifest(self, manifest: dict) -> None:
        write_atomic(self.manifest_file, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def load_starting_config(source: str, overrides: list[str]) -> ExperimentConfig:
    """load_config, with the encoder's sizes from model.init_from where the config leaves them
    out (inherit_encoder): the model a run of this config would build."""
    return inherit_encoder(*load_config_naming(source, overrides))


def resolve_train_config(source: str | None, overrides: list[str],
                         run_dir: Path | None) -> tuple[ExperimentConfig, RunDir]:
    """The config and run directory of `trainformer train [CONFIG] [--set ...] [--run-dir DIR]`.

    Without CONFIG, a run directory that holds a run resumes with its own config.yaml (the
    overrides it was started with included); otherwise the built-in default is used.
    """
    if source is None:
        existing = RunDir(run_dir or Path("runs") / DEFAULT_CONFIG)
        if existing.config_file.is_file():  # it names every key: inherit_encoder has nothing to take
            return load_starting_config(str(existing.config_file), overrides), existing
    config = load_starting_config(source, overrides)
    return config, RunDir(run_dir or Path("runs") / config.name)


def inherit_encoder(config: ExperimentConfig, named: Collection[str]) -> ExperimentConfig:
    """config with the encoder's sizes (ENCODER_KEYS, and max_length for learned positions) of
    the run it starts from (model.init_from) where it leaves them out (named: the dotted keys it
    names, config.load_config_naming). So a fine-tune names only what it changes, and the
    config.yaml it writes, which eval, predict, export and a resume read, holds the real sizes.
    Keys it names are kept: check_init_from refuses those that differ from the source's."""
    missing = [key for key in (*ENCODER_KEYS, "max_length") if f"model.{key}" not in named]
    source = RunDir(Path(config.model.init_from))
    if not config.model.init_from or not missing or not source.config_file.is_file():
        return config  # nothing to take, or nothing to take it from (check_init_from says so)
    pretrained = source.load_config()
    model = dataclasses.replace(config.model, **{key: getattr(pretrained.model, key)
                                                 for key in missing if key != "max_length"})
    if "max_length" in missing and model.position == pretrained.model.position == "learned":
        model.max_length = positions(pretrained)  # the rows of its position table
        if config.data.seq_len > model.max_length:
            raise UserError(f"data.seq_len: {config.data.seq_len} tokens but model.init_from={source.root} holds "
                            f"{model.max_length} positions; set data.seq_len={model.max_length} or less")
    inherited = dataclasses.replace(config, model=model)
    validate(inherited, f"model.init_from={source.root}")  # e.g. train.attention_layer for fewer layers
    return inherited


def positions(config: ExperimentConfig) -> int:
    """The positions a config's encoder holds (model.max_length 0: its longest windows)."""
    return config.model.max_length or max(config.data.seq_len, config.data.long_seq_len)


def check_decoder_init(config: ExperimentConfig, source: Path) -> None:
    """A seq2seq decoder that starts from the encoder (model.decoder_init=encoder) takes block i
    from encoder block i: it may have fewer blocks (the lowest are taken), not more (repeating
    blocks would make a decoder no pretraining run had)."""
    m = config.model
    if config.task.type != "seq2seq" or m.decoder_init != "encoder" or m.decoder_layers <= m.num_layers:
        return
    raise UserError(f"model.decoder_layers: {m.decoder_layers} decoder blocks but model.init_from={source} has "
                    f"{m.num_layers} encoder blocks to start them from; set model.decoder_layers={m.num_layers} "
                    f"or less, or model.decoder_init=random")


def check_same_split(config: ExperimentConfig, pretrained: ExperimentConfig, source: Path) -> None:
    """A run that starts from one trained on the same corpus (e.g. masked-LM on a labelled set's
    texts, then classify on its labels) must split it alike: with other fractions, texts this run
    validates and tests on may be ones the encoder was trained on, and its scores would flatter it."""
    theirs = (pretrained.data.valid_fraction, pretrained.data.test_fraction)
    ours = (config.data.valid_fraction, config.data.test_fraction)
    # a mix ("a+b", data/corpus.py) splits each of its sources as that source alone is split
    if config.data.corpus not in (pretrained.data.corpus, *pretrained.data.corpus.split("+")) or ours == theirs:
        return
    raise UserError(f"data.valid_fraction/test_fraction: {ours[0]}/{ours[1]} here but {theirs[0]}/{theirs[1]} in "
                    f"model.init_from={source}, which trained on {config.data.corpus} too: split alike, or this "
                    f"run would score texts its encoder was trained on (set data.valid_fraction={theirs[0]} "
                    f"data.test_fraction={theirs[1]})")


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


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    versions = {}
    for name in names:
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
