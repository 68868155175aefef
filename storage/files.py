"""Small durable-file primitives shared by everything that writes to disk."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """Make a rename, create or unlink in ``directory`` itself durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` all-or-nothing (temp file + rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        if fsync:
            os.fsync(file.fileno())
    os.replace(temporary, path)
    if fsync:
        fsync_directory(path.parent)
