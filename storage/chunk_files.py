"""A segment log's chunk files: the files themselves, their handles, and when their
bytes reach the disk.

A log is a directory of chunk files, each named after the offset of its first
record, so retention drops whole files from the head and rewrites nothing. Only the
last chunk (the active one) takes writes. This module owns the file side of that:
writes (``writev``, undone if they fail, so no half frame stays in front of the next
one), disk blocks reserved ahead of the active chunk, flushes as the durability
policy says (or left to the owner's timer), rolling to a new chunk, unlinking whole
chunks from the head, and reads by position. What the bytes mean (frames, offsets,
the index) is ``storage.segment_log``'s; it calls this under its own lock.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import UnavailableError
from storage.durability import Durability
from storage.files import fsync_directory, preallocate
from storage.frames import Encoded, scan_frames

_IOV_MAX = 1024  # buffers per writev (Linux's IOV_MAX)
_WRITE_BYTES = 1 << 20  # bytes per writev, see _write_groups
_PREALLOCATE_BYTES = 16 << 20  # reserved ahead of the active chunk's end, see _preallocate
_CHUNK_NAME = re.compile(r"(\d{20})\.log")
_datasync = getattr(os, "fdatasync", os.fsync)


@dataclass
class Chunk:
    base_offset: int
    path: Path
    size: int


class ChunkFiles:
    """The chunk files of one log directory. Not thread-safe: the log's lock guards it,
    except ``sync_and_close`` of descriptors ``take_unsynced`` handed out."""

    def __init__(
        self,
        directory: Path,
        durability: Durability,
        *,
        max_chunk_bytes: int,
        background_sync: bool,
        label: str,
    ) -> None:
        self.directory = directory
        self.chunks: list[Chunk] = []
        self._durability = durability
        self._max_chunk_bytes = max_chunk_bytes
        self._background_sync = background_sync
        self._label = label
        self._read_fds: dict[int, int] = {}
        self._write_fd: int | None = None
        self._dirty = False  # written since the last flush
        self._last_sync = time.monotonic()
        self._unsynced_fds: list[int] = []  # full chunks a background sync still owes
        self._preallocated = 0  # the active chunk's bytes with disk blocks reserved
        self._may_preallocate = True
        self.directory.mkdir(parents=True, exist_ok=True)

    # --- opening ----------------------------------------------------------------------

    def stored(self) -> list[tuple[int, Path]]:
        """The chunk files in the directory, by base offset (recovery scans them)."""
        found = []
        for path in self.directory.iterdir():
            match = _CHUNK_NAME.fullmatch(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def adopt(self, base_offset: int, path: Path) -> Chunk:
        """Take a chunk found on disk as the next one (its size grows as it is scanned)."""
        chunk = Chunk(base_offset, path, 0)
        self.chunks.append(chunk)
        return chunk

    def create(self, base_offset: int) -> Chunk:
        """A new, empty chunk after the others."""
        chunk = Chunk(base_offset, self.directory / f"{base_offset:020d}.log", 0)
        with open(chunk.path, "xb"):
            pass
        if self._durability.flushes:
            fsync_directory(self.directory)
        self.chunks.append(chunk)
        return chunk

    def open_for_appends(self) -> None:
        self._write_fd = os.open(self.chunks[-1].path, os.O_WRONLY | os.O_APPEND)

    @property
    def is_open(self) -> bool:
        return self._write_fd is not None

    @property
    def active(self) -> Chunk:
        return self.chunks[-1]

    def lost(self) -> str | None:
        """Why the files on disk are no longer this log's (its directory or a chunk
        removed, or the active chunk replaced under its open handle); ``None`` while they
        are. Writes to a removed file still succeed, so only a look at the paths tells."""
        if not self.directory.is_dir():
            return f"its directory {self.directory} is gone"
        inodes = []
        for chunk in self.chunks:
            try:
                inodes.append(os.stat(chunk.path).st_ino)
            except FileNotFoundError:
                return f"its chunk file {chunk.path.name} is gone"
        if self._write_fd is not None and inodes and os.fstat(self._write_fd).st_ino != inodes[-1]:
            return f"its chunk file {self.chunks[-1].path.name} was replaced"
        return None

    # --- writing ----------------------------------------------------------------------

    def write(self, frames: Sequence[Encoded]) -> int:
        """Write whole frames (header, payload) to the active chunk and return the
        position of the first; a failed write is undone. ``writev``: payloads go to the
        file without first being copied behind their headers."""
        chunk = self.chunks[-1]
        position = chunk.size
        size = 0
        try:
            for group, expected in _write_groups(frames):
                self._preallocate(position + size + expected)
                written = os.writev(self._write_fd, group)
                if written < expected:  # a short write (rare): the rest, whatever it takes
                    rest = memoryview(b"".join(group))[written:]
                    while rest:
                        rest = rest[os.write(self._write_fd, rest) :]
                size += expected
        except OSError:
            os.ftruncate(self._write_fd, position)  # which also gives back reserved blocks
            self._preallocated = 0
            raise
        chunk.size += size
        self._dirty = True
        return position

    def roll_if_full(self, next_base_offset: int) -> None:
        """Start a new chunk at ``next_base_offset`` once the active one is full, so
        retention has whole files to drop. The full chunk is flushed first (or handed
        to the background sync): later syncs only reach the active chunk's handle."""
        if self.chunks[-1].size < self._max_chunk_bytes:
            return
        if self._dirty and self._background_sync and self._durability.policy == "interval":
            self._unsynced_fds.append(os.dup(self._write_fd))
            self._dirty = False
        elif self._dirty and self._durability.flushes:
            self.fsync()
        self.release_preallocation()
        chunk = self.create(next_base_offset)
        full_chunk_fd, self._write_fd = (
            self._write_fd,
            os.open(chunk.path, os.O_WRONLY | os.O_APPEND),
        )
        os.close(full_chunk_fd)

    def release_preallocation(self) -> None:
        """Give back the blocks reserved past the active chunk's end."""
        if self._preallocated > self.chunks[-1].size:
            os.ftruncate(self._write_fd, self.chunks[-1].size)
        self._preallocated = 0

    def _preallocate(self, end: int) -> None:
        """Reserve the active chunk's blocks ahead of its writes, a step at a time and
        not past its planned size, so an idle segment holds at most one step."""
        if end <= self._preallocated or not self._may_preallocate:
            return
        target = max(end, min(self._preallocated + _PREALLOCATE_BYTES, self._max_chunk_bytes))
        start = self._preallocated
        self._may_preallocate = preallocate(self._write_fd, start, target - start)
        self._preallocated = target

    # --- flushing ---------------------------------------------------------------------

    def sync_per_policy(self) -> None:
        """After a write: flush if the policy says so now (``interval`` with a background
        sync leaves it to the owner's timer)."""
        policy = self._durability.policy
        due = time.monotonic() - self._last_sync >= self._durability.interval_s
        if policy == "fsync" or (policy == "interval" and due and not self._background_sync):
            self.fsync()

    def fsync(self) -> None:
        _datasync(self._write_fd)
        self._dirty = False
        self._last_sync = time.monotonic()

    def take_unsynced(self) -> list[int]:
        """Descriptors (duplicated, the caller closes them with ``sync_and_close``) of
        everything written and not flushed yet: the flush can then run outside the
        log's lock, and a roll cannot close them under it."""
        fds, self._unsynced_fds = self._unsynced_fds, []
        if self._dirty:
            fds.append(os.dup(self._write_fd))
            self._dirty = False
        return fds

    def synced(self) -> None:
        self._last_sync = time.monotonic()

    # --- reading and dropping ---------------------------------------------------------

    def pread(self, chunk_base: int, length: int, position: int) -> bytes:
        fd = self._read_fds.get(chunk_base)
        if fd is None:
            fd = os.open(self.directory / f"{chunk_base:020d}.log", os.O_RDONLY)
            self._read_fds[chunk_base] = fd
        data = os.pread(fd, length, position)
        if len(data) != length:
            raise UnavailableError(
                f"segment {self._label}: chunk {chunk_base} is shorter than its index says"
            )
        return data

    def drop_first(self) -> Chunk:
        """Unlink the oldest chunk (never the active one); returns it."""
        chunk = self.chunks.pop(0)
        fd = self._read_fds.pop(chunk.base_offset, None)
        if fd is not None:
            os.close(fd)
        chunk.path.unlink()
        return chunk

    def cut(self, chunk_base: int, position: int) -> None:
        """Drop every byte from ``position`` of chunk ``chunk_base`` on, and the chunks after
        it, durably if the policy flushes at all; leaves every handle closed (the log opens
        the files again and scans what is left)."""
        self.close()
        for chunk in self.chunks:
            if chunk.base_offset > chunk_base:
                chunk.path.unlink()
        path = self.directory / f"{chunk_base:020d}.log"
        os.truncate(path, position)
        if self._durability.flushes:
            fd = os.open(path, os.O_WRONLY)
            try:
                _datasync(fd)
            finally:
                os.close(fd)
            fsync_directory(self.directory)

    def rebase(self, base_offset: int) -> None:
        """Replace an empty log's chunks with one empty chunk at ``base_offset``; leaves
        every handle closed, as ``cut`` does."""
        self.close()
        for chunk in self.chunks:
            chunk.path.unlink()
        self.chunks = []
        self.create(base_offset)

    def synced_directory(self) -> None:
        """Make unlinks durable, if the policy flushes at all."""
        if self._durability.flushes:
            fsync_directory(self.directory)

    # --- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Release every handle; flushes first unless the policy says not to bother."""
        if self._write_fd is None:
            return
        if self._dirty and self._durability.flushes:
            self.fsync()
        sync_and_close(self._unsynced_fds)
        self._unsynced_fds = []
        self.release_preallocation()
        os.close(self._write_fd)
        self._write_fd = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    def verify(self) -> None:
        """Check every frame of every chunk against its checksum (``SegmentLog.verify``)."""
        for chunk in self.chunks:
            scanned = 0
            with open(chunk.path, "rb") as file:
                for frame, payload_length in scan_frames(file, chunk.base_offset):
                    scanned += frame.length(payload_length)
            if scanned != chunk.size:
                raise UnavailableError(
                    f"segment {self._label}: chunk {chunk.path.name} fails its checksums "
                    f"at byte {scanned} of {chunk.size}"
                )

    def delete(self) -> None:
        """Remove the directory and everything in it (the log's other files too)."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.directory)


def _write_groups(frames: Sequence[Encoded]) -> Iterator[tuple[list[bytes | memoryview], int]]:
    """The buffers of ``frames`` in ``writev``-sized groups, with their sizes: at most
    ``_IOV_MAX`` buffers and, unless one frame is larger, ``_WRITE_BYTES``: writes of
    several MB are much slower per byte than ~1 MB ones on the machines measured
    (bench/README.md, "Design measurements")."""
    group: list[bytes | memoryview] = []
    size = 0
    for header, payload, _ in frames:
        length = len(header) + len(payload)
        if group and (size + length > _WRITE_BYTES or len(group) + 2 > _IOV_MAX):
            yield group, size
            group, size = [], 0
        group += (header, payload)
        size += length
    if group:
        yield group, size


def sync_and_close(fds: list[int]) -> None:
    try:
        for fd in fds:
            _datasync(fd)
    finally:
        for fd in fds:
            os.close(fd)
