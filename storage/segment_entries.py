"""One metadata entry per segment of a topic incarnation, all under one path: the shape
shared by tiered segments' records (``storage.tier_records``), the node disks that hold
segments (``storage.placements``) and sleeping segments' kept stats
(``storage.asleep``). Each names its path in ``storage.catalog`` and its value's form;
listing, writing whole and removing are the same for all of them."""

from __future__ import annotations

import contextlib

from runtime.errors import AlreadyExistsError, KeyNotFoundError
from storage.metadata import MetadataStore


class SegmentEntries:
    """Entries ``{base}/{segment_id}`` of the metadata ``store``."""

    def __init__(self, store: MetadataStore, base: str) -> None:
        self.store, self._base = store, base

    def segment_ids(self) -> list[int]:
        """Every segment with an entry (one listing, no entry read)."""
        base = f"{self._base}/"
        return sorted(int(path[len(base) :]) for path in self.store.list(base))

    def _raw(self, segment_id: int) -> bytes | None:
        found = self.store.get(self._path(segment_id))
        return found.value if found is not None else None

    def _write(self, segment_id: int, value: bytes) -> None:
        """Write the entry whole, over one that is there."""
        path = self._path(segment_id)
        found = self.store.get(path)
        if found is None:
            self.store.put_if_absent(path, value)
        else:
            self.store.compare_and_swap(path, found.version, value)

    def _write_first(self, segment_id: int, value: bytes) -> bytes:
        """Write the entry unless one is there; returns the one that is."""
        with contextlib.suppress(AlreadyExistsError):
            self.store.put_if_absent(self._path(segment_id), value)
        stored = self._raw(segment_id)
        return stored if stored is not None else value

    def delete(self, segment_id: int) -> None:
        with contextlib.suppress(KeyNotFoundError):  # a repeated deletion
            self.store.delete(self._path(segment_id))

    def delete_all(self) -> None:
        self.store.delete_tree(self._base)

    def _path(self, segment_id: int) -> str:
        return f"{self._base}/{segment_id}"
