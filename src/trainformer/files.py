"""Small file helpers shared by everything that reads or writes run and export directories."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainformer.errors import UserError


def write_atomic(path: Path, text: str) -> None:
    """Write text so that readers see the old or the new file, never half of one."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def append_record(path: Path, record: dict) -> None:
    """Add one JSON line to a log, written whole in one call and synced: the lines before it
    are never rewritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_records(path: Path) -> list[dict]:
    """The JSON lines of a log (none where it does not exist), or a UserError naming the line
    that is not one."""
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{number}: not a JSON record ({err.msg})") from None
    return records


def read_json(path: Path) -> dict:
    """A JSON object from a file, or a UserError naming the file and what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot be read ({err})") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    return data
