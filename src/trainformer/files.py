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
