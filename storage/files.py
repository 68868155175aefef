"""Small durable-file primitives shared by everything that writes to disk."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path

_FALLOC_FL_KEEP_SIZE = 1


def fsync_directory(directory: Path) -> None:
    """Make a rename, create or unlink in ``directory`` itself durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` all-or-nothing (temp file + rename). The temp file is
    this writer's own: two writers of one path (a segment laid out by two attempts at
    once) would otherwise rename each other's."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        if fsync:
            os.fsync(file.fileno())
    os.replace(temporary, path)
    if fsync:
        fsync_directory(path.parent)


def preallocate(fd: int, offset: int, length: int) -> bool:
    """Reserve disk blocks for bytes ``offset`` to ``offset + length`` of ``fd`` without
    changing its size (Linux ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``), as Kafka's
    ``log.preallocate`` does. Appends into reserved blocks skip ext4's delayed
    allocation, which ``perf`` put at ~17% of a segment's CPU while it appended 500 MB/s.
    False where the system or the file system cannot: appends work as before.
    ``os.ftruncate(fd, size)`` gives back what was reserved past ``size``."""
    fallocate = _fallocate()
    return fallocate is not None and fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0


@functools.cache
def _fallocate() -> Callable[[int, int, int, int], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):  # not Linux
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int
    return function
