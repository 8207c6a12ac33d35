"""Result files: written atomically, so a crash never leaves half a file where a finished one is expected."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes) -> Path:
    """Write via a temp file in the same directory + os.replace, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(path: Path, value: Any) -> Path:
    return write_atomic(path, json.dumps(value, indent=2, default=float).encode())


def read_json(path: Path) -> dict[str, Any]:
    """A result file's contents, or {} when that step has not finished."""
    return json.loads(path.read_text()) if path.exists() else {}
