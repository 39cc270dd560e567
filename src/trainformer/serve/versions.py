"""Model versions as TF Serving manages them: a base path holds version folders BASE/<N>/, the
highest is served, a new one is picked up while running, and the one it replaces is unloaded
once the requests in flight on it are answered, so no request fails during the switch.

Each version goes LOADING -> AVAILABLE -> UNLOADING -> END (or LOADING -> END with an error,
while the old version keeps serving); status lists them all, as TF Serving's does.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from trainformer.errors import UserError
from trainformer.serve.model import ServedModel, first_line
from trainformer.serve.protocol import ClientError, Rules

log = logging.getLogger("trainformer.serve")

LOADING, AVAILABLE, UNLOADING, END = "LOADING", "AVAILABLE", "UNLOADING", "END"


def version_numbers(base: Path) -> list[int]:
    """The version folders under BASE, as TF Serving sees them: all-digit names only (an
    export's staging folders, e.g. `.7.partial`, never are), each holding saved_model.pb."""
    try:
        children = list(base.iterdir())
    except OSError:
        return []
    return sorted(int(child.name) for child in children
                  if child.name.isdigit() and (child / "saved_model.pb").is_file())


def check_base(base: Path) -> int:
    """The highest version under BASE, or a UserError telling a user what to pass instead."""
    if not base.is_dir():
        raise UserError(f"{base}: no such directory (the base path trainformer export --out wrote)")
    numbers = version_numbers(base)
    if numbers:
        return numbers[-1]
    if (base / "saved_model.pb").is_file():
        hint = f"pass its parent, {base.parent}" if base.name.isdigit() else \
            "put it in a numbered folder (BASE/1/) and pass BASE"
        raise UserError(f"{base} is a version folder, not a base path: {hint}")
    if (base / "saved_model" / "saved_model.pb").is_file():
        raise UserError(f"{base} holds an export in the old layout (saved_model/ at its top): export the run "
                        "again to a new folder (trainformer export RUN_DIR --out BASE writes BASE/<version>/)")
    raise UserError(f"{base}: no version folders (BASE/<N>/saved_model.pb, as trainformer export writes)")


class Version:
    """One version folder: its state, its model while loaded, and its requests in flight."""

    def __init__(self, number: int, folder: Path):
        self.number = number
        self.folder = folder
        self.state = LOADING
        self.error = ""
        self.model: ServedModel | None = None
        self.rules = Rules()
        self.in_flight = 0
        self.changed = threading.Condition()

    def load(self, max_instances: int) -> None:
        """Load and warm up; AVAILABLE, or END with the error (which is raised)."""
        try:
            model = ServedModel.load(self.folder)
            warm_up(model)
        except Exception as err:
            with self.changed:
                self.state, self.error = END, first_line(err)
            raise
        meta = model.metadata
        with self.changed:
            self.model = model
            self.rules = Rules(max_instances, model.pad_id, meta.get("vocab_size"), meta.get("max_length"))
            self.state = AVAILABLE

    def acquire(self) -> bool:
        """Count a request in; False once the version is no longer AVAILABLE."""
        with self.changed:
            if self.state != AVAILABLE:
                return False
            self.in_flight += 1
            return True

    def release(self) -> None:
        with self.changed:
            self.in_flight -= 1
            self.changed.notify_all()

    def unload(self) -> None:
        """Take no new requests, wait for those in flight, then drop the model (its memory
        goes when the last reference does)."""
        with self.changed:
            self.state = UNLOADING
            self.changed.wait_for(lambda: self.in_flight == 0)
            self.model = None
            self.state = END
        log.info("unloaded version %d of %s", self.number, self.folder.parent)

    def status(self) -> dict:
        code = "OK" if not self.error else "UNKNOWN"
        return {"version": str(self.number), "state": self.state,
                "status": {"error_code": code, "error_message": self.error}}


class ModelVersions:
    """The versions of one model name, from its base path."""

    def __init__(self, name: str, base: Path, max_instances: int):
        self.name = name
        self.base = base
        self.max_instances = max_instances
        self.versions: dict[int, Version] = {}
        self.latest: Version | None = None
        self.lock = threading.Lock()

    def load_first(self) -> Version:
        """The highest version, loaded before the server says it serves (a failure is a UserError)."""
        number = check_base(self.base)
        return self.load(number)

    def load(self, number: int) -> Version:
        version = Version(number, self.base / str(number))
        with self.lock:
            self.versions[number] = version
        version.load(self.max_instances)
        with self.lock:
            old, self.latest = self.latest, version  # new requests go to the new version from here on
        if old is not None:
            threading.Thread(target=old.unload, name=f"unload-{self.name}-{old.number}", daemon=True).start()
        return version

    def poll(self) -> None:
        """Serve the highest version folder if it is not served yet: a new one, or, when the
        folder of the one serving was removed, the highest left (TF Serving does the same). One
        that failed to load is not tried again: the one serving keeps serving."""
        numbers = version_numbers(self.base)
        if not numbers or (self.latest is not None and self.latest.number == numbers[-1]):
            return  # no folder at all (being replaced?): keep serving what is loaded
        tried = self.versions.get(numbers[-1])
        if tried is not None and (tried.error or tried.state != END):
            return
        try:
            version = self.load(numbers[-1])
        except Exception as err:
            log.error("%s: version %d failed to load, still serving %s: %s", self.name, numbers[-1],
                      self.latest.number if self.latest else "none", first_line(err))
            return
        log.info("%s: serving version %d", self.name, version.number)

    def acquire(self, number: int | None) -> Version:
        """The version a request goes to (the latest unless it names one), counted in flight
        until the caller releases it; one not AVAILABLE is a 404 in TF Serving's words."""
        with self.lock:  # acquired under the lock that switches versions: never the one just retired
            version = self.latest if number is None else self.versions.get(number)
            acquired = version is not None and version.acquire()
        if not acquired:
            spec = f"Latest({self.name})" if number is None else f"Specific({self.name}, {number})"
            raise ClientError(f"Servable not found for request: {spec}", status=404)
        return version

    def status(self, number: int | None) -> list[dict]:
        with self.lock:
            known = dict(self.versions)
        if number is None:
            return [known[key].status() for key in sorted(known, reverse=True)]
        if number not in known:
            raise ClientError(f"Could not find version {number} of model {self.name}", status=404)
        return [known[number].status()]


class Registry:
    """Every model served, by name, and the thread that polls their base paths."""

    def __init__(self, models: dict[str, ModelVersions], poll_seconds: float = 1.0):
        self.models = models
        self.poll_seconds = poll_seconds
        self.stopping = threading.Event()
        self.poller = threading.Thread(target=self._poll, name="version-poller", daemon=True)

    def start(self) -> None:
        if self.poll_seconds > 0:
            self.poller.start()

    def stop(self) -> None:
        self.stopping.set()

    def find(self, name: str) -> ModelVersions:
        if name not in self.models:
            raise ClientError(f"Could not find any versions of model {name} (this server serves "
                              f"{', '.join(sorted(self.models))})", status=404)
        return self.models[name]

    def _poll(self) -> None:
        while not self.stopping.wait(self.poll_seconds):
            for model in self.models.values():
                try:
                    model.poll()
                except Exception:  # the poller must outlive any one surprise
                    log.exception("%s: polling %s failed", model.name, model.base)


def parse_version(text: str | None) -> int | None:
    """A URL's version: digits, else a 404 as TF Serving gives for a version it cannot have."""
    if text is None:
        return None
    if not text.isdigit():
        raise ClientError(f"version {text!r} is not a number", status=404)
    return int(text)


def warm_up(model: ServedModel) -> None:
    """One real call before a version takes requests: the first is slow, and a model that
    cannot answer is a bad version folder, not one that fails every request."""
    signature = model.signatures["serving_default"]
    if [info.is_text for info in signature.inputs.values()] != [True]:
        return
    try:
        signature({next(iter(signature.inputs)): np.array([b"warm up"], dtype=object)})
    except Exception as err:
        raise UserError(f"{model.model_dir}: the model fails on a first text: {first_line(err)}") from err


def submit(registry: Registry, batcher, name: str, number: int | None, prepare):
    """One predict request, REST or gRPC alike: find the version, turn the request into
    inputs with `prepare(version) -> (signature name, arrays)`, queue it on the shared batcher.
    The version stays counted in flight until the model has answered, so it is never unloaded
    under a queued request. Returns (version, signature name, future of the outputs)."""
    version = registry.find(name).acquire(number)
    try:
        signature_name, inputs = prepare(version)
        future = batcher.submit(version.model.signatures[signature_name], inputs)
    except BaseException:
        version.release()
        raise
    future.add_done_callback(lambda _: version.release())
    return version, signature_name, future
