"""The in-memory index of a segment log: every retained batch, in offset order, with
what a read, a seek by publish time and retention need, so none of them parses a
frame header again.

Two parallel lists, base offsets and entries, so the lookups are ``bisect`` on
plain ints. Publish times never decrease along a log, so a seek by time is a
binary search too. The index is rebuilt from the frame headers on open
(``SegmentLog``'s recovery), which makes it a cache of the files, never a record.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import NamedTuple

from storage.frames import FRAME_BATCH, FRAME_TXN_MARKER, Frame


class IndexEntry(NamedTuple):
    """One stored batch (or transaction marker): its offsets, where its frame is, its
    producer's fields and its transaction's. A named tuple, like ``Frame``: every append
    makes one."""

    base_offset: int
    count: int
    chunk_base: int
    position: int
    frame_length: int
    payload_length: int
    publish_time_ms: int
    producer_id: str | None
    sequence: int | None
    frame_type: int = FRAME_BATCH
    txn_id: str | None = None

    @classmethod
    def of(
        cls, frame: Frame, chunk_base: int, position: int, payload_length: int, frame_length: int
    ) -> IndexEntry:
        return cls(
            frame.base_offset,
            frame.count,
            chunk_base,
            position,
            frame_length,
            payload_length,
            frame.publish_time_ms,
            frame.producer_id,
            frame.sequence,
            frame.frame_type,
            frame.txn_id,
        )


class LogIndex:
    """The batches of one log from the oldest still indexed on."""

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.entries: list[IndexEntry] = []

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: IndexEntry) -> None:
        """A batch stored after every indexed one."""
        self.bases.append(entry.base_offset)
        self.entries.append(entry)

    def first_from(self, offset: int) -> int:
        """Position of the first entry starting at or after ``offset``."""
        return bisect.bisect_left(self.bases, offset)

    def covering(self, offset: int, max_records: int) -> list[IndexEntry]:
        """The entries holding offsets ``[offset, offset + max_records)``."""
        first = bisect.bisect_right(self.bases, offset) - 1
        last = bisect.bisect_left(self.bases, offset + max_records)
        return self.entries[max(first, 0) : last]

    def visible_from(
        self, offset: int, max_records: int, stable_end: int, visible: Callable[[str | None], bool]
    ) -> tuple[list[IndexEntry], int]:
        """The entries holding the first ``max_records`` records from ``offset`` that a
        reader of committed data gets (below ``stable_end``, not a marker, ``visible``
        by their transaction), and the offset after the last entry looked at."""
        entries, chosen, next_offset, remaining = self.entries, [], offset, max_records
        position = max(bisect.bisect_right(self.bases, offset) - 1, 0)
        while position < len(entries) and remaining > 0:
            entry = entries[position]
            position += 1
            end = entry.base_offset + entry.count
            if entry.base_offset >= stable_end:
                break
            if end <= offset:
                continue
            if entry.frame_type == FRAME_TXN_MARKER or not visible(entry.txn_id):
                next_offset = end
                continue
            start = max(offset, entry.base_offset)
            taken = min(end - start, remaining)
            chosen.append(entry)
            remaining -= taken
            next_offset = start + taken
        return chosen, next_offset

    def hidden_from(
        self, offset: int, hidden: Callable[[str | None], bool]
    ) -> list[tuple[int, int]]:
        """The half-open ranges at or after ``offset`` that no reader will ever get:
        transaction markers, and the batches of transactions ``hidden`` says aborted;
        adjacent ones joined."""
        ranges: list[tuple[int, int]] = []
        for entry in self.entries[max(bisect.bisect_right(self.bases, offset) - 1, 0) :]:
            end = entry.base_offset + entry.count
            if end <= offset:
                continue
            if entry.frame_type == FRAME_TXN_MARKER or hidden(entry.txn_id):
                start = max(offset, entry.base_offset)
                if ranges and ranges[-1][1] == start:
                    ranges[-1] = (ranges[-1][0], end)
                else:
                    ranges.append((start, end))
        return ranges

    def first_published(self, start_offset: int, time_ms: int) -> int | None:
        """The base offset of the first batch from ``start_offset`` on published at or
        after ``time_ms``; None when there is none."""
        index = bisect.bisect_left(
            self.entries,
            time_ms,
            lo=self.first_from(start_offset),
            key=lambda entry: entry.publish_time_ms,
        )
        return self.bases[index] if index < len(self.entries) else None

    def ending_by(self, keep_from: int | None) -> int:
        """How many leading entries end at or before ``keep_from`` (all for None)."""
        if keep_from is None:
            return len(self.entries)
        count = bisect.bisect_right(self.bases, keep_from)
        if (
            count
            and self.entries[count - 1].base_offset + self.entries[count - 1].count > keep_from
        ):
            count -= 1
        return count

    def forget_below(self, offset: int) -> None:
        """Drop the entries of batches starting below ``offset`` (no longer readable)."""
        keep = bisect.bisect_left(self.bases, offset)
        del self.bases[:keep]
        del self.entries[:keep]


def adjacent_runs(entries: list[IndexEntry]) -> Iterator[list[IndexEntry]]:
    """Group entries whose frames are back to back in one chunk (one ``pread`` each)."""
    run: list[IndexEntry] = []
    for entry in entries:
        if run and (
            entry.chunk_base != run[-1].chunk_base
            or entry.position != run[-1].position + run[-1].frame_length
        ):
            yield run
            run = []
        run.append(entry)
    if run:
        yield run
