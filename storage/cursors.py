"""Subscription cursors of one segment: what each subscription has acknowledged.

Modelled on Pulsar's ManagedCursor: a cumulative ``mark_delete`` position (every
offset below it is acknowledged) plus individually acknowledged ranges above
it. Shared/queue consumers ack out of order, so holes must be representable;
ranges keep that compact when most offsets are acknowledged in runs.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import json
import re
import secrets
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from runtime.errors import InvalidArgumentError, SubscriptionNotFoundError
from storage.files import atomic_write, fsync_directory

Position = Literal["earliest", "latest"]

_NAME = re.compile(r"[A-Za-z0-9_.=-]{1,128}")
_SUFFIX = ".json"


def validate_subscription_name(name: str) -> str:
    """Names become file names, so only a safe alphabet is accepted."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"invalid subscription name {name!r}: use 1-128 characters of "
            "letters, digits, '_', '.', '=', '-'"
        )
    return name


class Cursor:
    """Acknowledgement state of one subscription in one segment.

    Invariant: ``acked_ranges`` is sorted, its half-open ranges are disjoint and
    never touch each other or ``mark_delete``, so ``mark_delete`` is always the
    first unacknowledged offset and equal states have equal representations.
    """

    def __init__(
        self, name: str, mark_delete: int = 0, acked_ranges: Iterable[tuple[int, int]] = ()
    ) -> None:
        self.name = validate_subscription_name(name)
        _check_offset("mark_delete", mark_delete)
        self._mark_delete = mark_delete
        self._ranges: list[tuple[int, int]] = _coalesce(sorted(acked_ranges))
        self._normalize()

    @property
    def mark_delete(self) -> int:
        return self._mark_delete

    @property
    def acked_ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(self._ranges)

    def ack_cumulative(self, offset: int) -> bool:
        """Acknowledge every offset up to and including ``offset``.

        Going backwards is a no-op rather than an error, because cumulative acks
        from a consumer may arrive late or be replayed. Returns whether anything
        changed, so callers can skip persisting a no-op.
        """
        _check_offset("offset", offset)
        if offset < self._mark_delete:
            return False
        self._mark_delete = offset + 1
        self._normalize()
        return True

    def ack(self, offsets: Iterable[int]) -> bool:
        """Acknowledge individual offsets; returns whether anything changed."""
        requested = sorted(set(offsets))
        if requested:
            _check_offset("offset", requested[0])
        fresh = [offset for offset in requested if not self.is_acked(offset)]
        if not fresh:
            return False
        new_ranges = _coalesce((offset, offset + 1) for offset in fresh)
        self._ranges = _coalesce(heapq.merge(self._ranges, new_ranges))
        self._normalize()
        return True

    def ack_ranges(self, ranges: Iterable[tuple[int, int]]) -> bool:
        """Acknowledge every offset of the half-open ``ranges``; returns whether anything
        changed."""
        fresh = sorted((start, end) for start, end in ranges if start < end)
        if fresh:
            _check_offset("offset", fresh[0][0])
        if all(self.first_unacked(start) >= end for start, end in fresh):
            return False
        self._ranges = _coalesce(heapq.merge(self._ranges, _coalesce(fresh)))
        self._normalize()
        return True

    def is_acked(self, offset: int) -> bool:
        if offset < self._mark_delete:
            return True
        index = bisect.bisect_right(self._ranges, (offset, float("inf"))) - 1
        return index >= 0 and offset < self._ranges[index][1]

    def backlog(self, end_offset: int) -> int:
        """Unacknowledged offsets below ``end_offset``."""
        if end_offset <= self._mark_delete:
            return 0
        acked = sum(
            min(end, end_offset) - start for start, end in self._ranges if start < end_offset
        )
        return end_offset - self._mark_delete - acked

    def first_unacked(self, from_offset: int) -> int:
        """The first unacknowledged offset at or after ``from_offset`` (may be past the end)."""
        offset = max(from_offset, self._mark_delete)
        index = bisect.bisect_right(self._ranges, (offset, float("inf"))) - 1
        if index >= 0 and offset < self._ranges[index][1]:
            return self._ranges[index][1]
        return offset

    def copy(self) -> Cursor:
        return Cursor(self.name, self._mark_delete, self._ranges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mark_delete": self._mark_delete,
            "acked_ranges": [list(r) for r in self._ranges],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cursor:
        try:
            ranges = [(int(start), int(end)) for start, end in data.get("acked_ranges", [])]
            return cls(str(data["name"]), int(data["mark_delete"]), ranges)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"malformed cursor record {data!r}: {exc}") from exc

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cursor):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Cursor({self.name!r}, mark_delete={self._mark_delete}, ranges={self._ranges})"

    def _normalize(self) -> None:
        """Fold ranges that reach ``mark_delete`` into it and drop those below it."""
        ranges = self._ranges
        first_kept = 0
        while first_kept < len(ranges) and ranges[first_kept][0] <= self._mark_delete:
            self._mark_delete = max(self._mark_delete, ranges[first_kept][1])
            first_kept += 1
        if first_kept:
            del ranges[:first_kept]


class CursorBackend(Protocol):
    """Where a segment's cursors persist: its directory, or the metadata record of a
    tiered segment (``storage.tier_records``)."""

    def load(self) -> Iterator[Cursor]: ...

    def save(self, cursor: Cursor, *, create: bool) -> bool:
        """Persist ``cursor``; without ``create`` only over one still stored (returns
        whether it was: a subscription deleted by another writer stays deleted)."""
        ...

    def remove(self, name: str) -> None: ...


class CursorFiles:
    """Each cursor as ``cursors/{name}.json`` in the segment's directory.

    One small file per cursor means an ack rewrites only its own subscription's
    state, and the write-to-temp + rename makes every update all-or-nothing
    across crashes.
    """

    def __init__(self, directory: Path, *, fsync: bool) -> None:
        self._directory = Path(directory) / "cursors"
        self._fsync = fsync
        self._directory.mkdir(parents=True, exist_ok=True)

    def load(self) -> Iterator[Cursor]:
        for path in self._directory.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink()  # an update interrupted before its rename; the old file stands
            elif path.name.endswith(_SUFFIX):
                yield Cursor.from_dict(json.loads(path.read_bytes()))

    def save(self, cursor: Cursor, *, create: bool) -> bool:
        data = json.dumps(cursor.to_dict(), separators=(",", ":")).encode()
        atomic_write(self._path(cursor.name), data, fsync=self._fsync)
        return True  # the segment's own actor is the only writer of its files

    def remove(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)
        if self._fsync:
            fsync_directory(self._directory)

    def _path(self, name: str) -> Path:
        return self._directory / f"{name}{_SUFFIX}"


class CursorStore:
    """All cursors of one segment, in memory and persisted on every change, except
    cumulative acks taken with ``save_later``: those wait for ``save_unsaved``.

    Who calls: the segment's store, for its actor (acks, subscriptions), and the actor's
    saver thread (``save_unsaved``). What it affects: the backend's copy, before the call
    returns (a deferred ack: when ``save_unsaved`` runs).

    Why defer: a stream consumer's reads carry its cumulative ack, up to twenty a second
    per segment, and each save replaces a file (a rename over an existing file makes ext4
    write the new one's blocks at once). Saved at most once per saver period, as Pulsar
    rate-limits its cursors' mark-delete writes, a crash of the segment's process gives a
    consumer that resumes from the cursor at most that period's messages again, which
    at-least-once delivery allows; the log itself loses nothing.
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        fsync: bool = False,
        backend: CursorBackend | None = None,
    ) -> None:
        if backend is None:
            if directory is None:
                raise ValueError("a cursor store needs a directory or a backend")
            backend = CursorFiles(directory, fsync=fsync)
        self._backend = backend
        self._lock = threading.Lock()
        self._cursors: dict[str, Cursor] = {c.name: c for c in backend.load()}
        self._unsaved: set[str] = set()  # names whose cursor is ahead of the backend's
        # Raised by every change: a replicated segment's followers ask for the cursors
        # again when it moved (``export``). It starts at random, so a restarted store
        # never repeats a version a follower already holds.
        self.version = secrets.randbits(48) << 8

    def create(self, name: str, position: Position, start_offset: int, end_offset: int) -> Cursor:
        """Create a cursor at the first or the next offset; an existing cursor is kept
        unchanged, so a re-subscribe after a restart does not lose its position."""
        validate_subscription_name(name)
        if position not in ("earliest", "latest"):
            raise InvalidArgumentError(f"position must be 'earliest' or 'latest', got {position!r}")
        if not 0 <= start_offset <= end_offset:
            raise InvalidArgumentError(
                f"need 0 <= start_offset <= end_offset, got {start_offset}, {end_offset}"
            )
        with self._lock:
            cursor = self._cursors.get(name)
            if cursor is None:
                mark = start_offset if position == "earliest" else end_offset
                cursor = Cursor(name, mark)
                self._backend.save(cursor, create=True)
                self._cursors[name] = cursor
                self.version += 1
            return cursor.copy()

    def get(self, name: str) -> Cursor:
        """A snapshot: changing it does not change (or persist) the stored cursor."""
        with self._lock:
            return self._live(name).copy()

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._cursors)

    def snapshot(self) -> list[Cursor]:
        """Copies of every cursor (what a move to the tier carries over)."""
        with self._lock:
            return [c.copy() for c in self._cursors.values()]

    def delete(self, name: str) -> None:
        validate_subscription_name(name)
        with self._lock:
            self._cursors.pop(name, None)
            self._unsaved.discard(name)
            self._backend.remove(name)
            self.version += 1

    def move(self, name: str, offset: int) -> Cursor:
        """Put the subscription's cursor at ``offset``: everything before it counts as
        acknowledged, everything from it on as not (a reset: acks beyond it are gone)."""
        _check_offset("offset", offset)
        with self._lock:
            self._live(name)
            cursor = Cursor(name, offset)
            self._cursors[name] = cursor
            self.version += 1
            self._persist(cursor)
            return cursor.copy()

    def ack_cumulative(self, name: str, offset: int, *, save_later: bool = False) -> bool:
        """Returns whether the cursor now waits for ``save_unsaved`` (only with
        ``save_later``, when the ack moved it)."""
        with self._lock:
            cursor = self._live(name)
            if not cursor.ack_cumulative(offset):
                return False
            self.version += 1
            if save_later:
                self._unsaved.add(name)
                return True
            self._persist(cursor)
            return False

    def save_unsaved(self) -> None:
        """Persist the cursors that deferred acks moved. One cursor at a time under the
        lock, so an ack waits for at most one file, and a reset or delete in between is
        never overwritten by an older state."""
        while True:
            with self._lock:
                if not self._unsaved:
                    return
                name = self._unsaved.pop()
                cursor = self._cursors.get(name)
                if cursor is not None:  # deleted since: nothing to save
                    with contextlib.suppress(SubscriptionNotFoundError):
                        self._persist(cursor)

    def ack(self, name: str, offsets: Iterable[int]) -> None:
        with self._lock:
            cursor = self._live(name)
            if cursor.ack(offsets):
                self.version += 1
                self._persist(cursor)

    def ack_ranges(self, ranges: Sequence[tuple[int, int]], names: Iterable[str] = ()) -> None:
        """Acknowledge ``ranges`` for the cursors ``names`` (every cursor when none is
        named): offsets no reader will get must not hold a subscription's backlog."""
        if not ranges:
            return
        with self._lock:
            for name in list(names) or list(self._cursors):
                cursor = self._live(name)
                if cursor.ack_ranges(ranges):
                    self.version += 1
                    self._persist(cursor)

    def export(self) -> tuple[int, bytes]:
        """The version and every cursor, acks not saved yet included: what a replicated
        segment's leader ships to its followers when their version differs."""
        with self._lock:
            cursors = [cursor.to_dict() for cursor in self._cursors.values()]
            return self.version, json.dumps(cursors, separators=(",", ":")).encode()

    def adopt(self, exported: bytes) -> None:
        """Make this store hold exactly the cursors ``export`` gave (a follower's, from
        its leader's), each saved before it returns. ``InvalidArgumentError`` for bytes
        that are not an export, and nothing changes then."""
        try:
            data = json.loads(exported)
        except ValueError as err:
            raise InvalidArgumentError(f"cursors that cannot be adopted: {err}") from None
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise InvalidArgumentError("cursors that cannot be adopted: not a list of cursors")
        cursors = {c.name: c for c in map(Cursor.from_dict, data)}
        with self._lock:
            for name in set(self._cursors) - set(cursors):
                self._cursors.pop(name)
                self._unsaved.discard(name)
                self._backend.remove(name)
            for name, cursor in cursors.items():
                if self._cursors.get(name) != cursor:
                    self._backend.save(cursor, create=name not in self._cursors)
                    self._cursors[name] = cursor
                    self._unsaved.discard(name)
            self.version += 1

    def abandon_unsaved(self) -> None:
        """Forget the deferred acks, for a store whose files are about to be removed (the
        segment deleted, or its cursors carried to the tier): a save running now ends
        first, and none starts after."""
        with self._lock:
            self._unsaved.clear()

    def _live(self, name: str) -> Cursor:
        cursor = self._cursors.get(name)
        if cursor is None:
            # Another writer (the controller, for a tiered segment) may have added it.
            for stored in self._backend.load():
                self._cursors.setdefault(stored.name, stored)
            cursor = self._cursors.get(name)
        if cursor is None:
            raise SubscriptionNotFoundError(f"subscription {name!r} does not exist")
        return cursor

    def _persist(self, cursor: Cursor) -> None:
        self._unsaved.discard(cursor.name)
        if not self._backend.save(cursor, create=False):
            self._cursors.pop(cursor.name, None)
            raise SubscriptionNotFoundError(f"subscription {cursor.name!r} was deleted")


def stored_subscriptions(segment_directory: Path) -> list[str]:
    """The subscriptions with a cursor in a segment's storage, read without opening it
    (the storage check and recovery look at segments no actor serves)."""
    directory = Path(segment_directory) / "cursors"
    if not directory.is_dir():
        return []
    names = (p.name[: -len(_SUFFIX)] for p in directory.iterdir() if p.name.endswith(_SUFFIX))
    return sorted(n for n in names if _NAME.fullmatch(n))


def _check_offset(what: str, offset: int) -> None:
    if not isinstance(offset, int) or offset < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative integer, got {offset!r}")


def _coalesce(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge sorted half-open ranges that overlap or touch; drop empty ones."""
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
