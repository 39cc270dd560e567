"""The export base folder as TF Serving reads it: BASE/<version>/, one folder per version.

TF Serving's `--model_base_path` holds version folders whose names are numbers (its rule: a
child folder whose whole name parses as a non-negative integer is a version; the highest is
served and a new one is picked up while it runs). So a version folder must appear complete:
it is written as BASE/.<version>.partial (never a number, so a poller ignores it) and renamed
into place, one atomic step. Removing a version goes the same way backwards (renamed to
BASE/.<version>.old, then deleted).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from trainformer.errors import UserError

VERSION_NAME = re.compile(r"[0-9]+")
OURS = re.compile(r"\.[0-9]+\.(partial|old)")  # staging and removal folders of an export
OLD_LAYOUT = ("saved_model", "metadata.json")  # what an export held at its top before versions


def versions(base: Path) -> list[int]:
    """The version numbers under base, lowest first: TF Serving's own rule."""
    if not base.is_dir():
        return []
    return sorted(int(child.name) for child in base.iterdir() if _is_version(child))


def check_base(base: Path) -> None:
    """BASE may be new, empty, or hold versions (and our staging leftovers): nothing else,
    so an export never mixes its versions into a folder of other files."""
    if base.exists() and not base.is_dir():
        raise UserError(f"--out {base}: is a file; give a folder for the export's versions")
    if not base.is_dir():
        return
    names = sorted(child.name for child in base.iterdir())
    if (base / "saved_model.pb").exists():
        raise UserError(f"--out {base}: is itself a SavedModel (a version folder?); give the folder above it, "
                        f"which holds the versions")
    old = [name for name in names if name in OLD_LAYOUT]
    if old:
        raise UserError(f"--out {base}: holds an export in the old layout ({', '.join(old)} at its top), which TF "
                        f"Serving cannot serve; export to a new folder, or remove it")
    others = [name for name in names if not (_is_version(base / name) or OURS.fullmatch(name))]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UserError(f"--out {base}: holds {shown} besides export versions; choose a new or empty folder")


def _is_version(path: Path) -> bool:
    return path.is_dir() and bool(VERSION_NAME.fullmatch(path.name))


def check_version(base: Path, version: int) -> None:
    """Versions are immutable, as TF Serving treats them: a server that loaded version N never
    reloads it, so replacing its files would leave servers answering with different models
    under one number."""
    if (base / str(version)).exists():
        raise UserError(f"--out {base}: version {version} exists and versions are never replaced (TF Serving "
                        f"would not reload it); give --version N, or remove {base / str(version)}")


def staging(base: Path, version: int) -> Path:
    """An empty BASE/.<version>.partial (a crashed export's leftovers there are removed)."""
    folder = base / f".{version}.partial"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def publish(folder: Path, base: Path, version: int) -> Path:
    """The staging folder becomes BASE/<version> in one rename."""
    target = base / str(version)
    try:
        folder.rename(target)
    except OSError:  # another export wrote that version meanwhile
        raise UserError(f"--out {base}: version {version} appeared while exporting; this export stays in "
                        f"{folder}") from None
    return target


def prune(base: Path, keep: int, written: int) -> list[int]:
    """Remove all but the `keep` highest versions (never the one just written); returns the
    versions removed."""
    removed = [version for version in versions(base)[:-keep] if version != written]
    for version in removed:
        gone = base / f".{version}.old"
        shutil.rmtree(gone, ignore_errors=True)
        (base / str(version)).rename(gone)  # out of a server's sight at once, deleted after
        shutil.rmtree(gone)
    return removed
