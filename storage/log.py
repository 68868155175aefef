"""``SegmentRecords``: what a segment's records are kept in, as the rest of the system
sees it.

A segment's store (``storage.segment_store``) holds one of these and never asks
which it is for reads, appends, sealing, retention or answers to a producer. Two
implement it today: the local log on the node's disk (``storage.segment_log``)
and a sealed segment moved to object storage (``storage.tier.TieredSegment``),
which refuses appends as a sealed log does. A replicated log is the next one: it
answers the same calls, with its own rule for when an append is stored.

Nothing outside ``storage/`` touches an implementation: the segment actor and its
appender go through the store, which exposes the parts of this they need
(``end_offset``, ``terminated``, ``last_sequence``...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from runtime.batch import DELIVERY_SCHEMA, empty_batch, int64_array
from runtime.errors import ScalableTopicsError
from storage.appends import Append, AppendResult, StoredBatch


@runtime_checkable
class SegmentRecords(Protocol):
    """One segment's ordered records: offsets from ``start_offset`` (what retention kept)
    to ``end_offset`` (the next to be written); once ``terminated``, no more appends."""

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def terminated(self) -> bool: ...

    @property
    def terminated_at_ms(self) -> int | None: ...

    @property
    def last_publish_time_ms(self) -> int | None: ...

    def publish_time_at(self, offset: int) -> int | None:
        """When the batch holding ``offset`` was published (None: not held)."""
        ...

    def offset_at_time(self, time_ms: int) -> int:
        """The first offset published at or after ``time_ms`` (``end_offset``: none)."""
        ...

    def last_sequence(self, producer_id: str) -> int:
        """The highest sequence stored for ``producer_id`` (-1: none): a producer resumes
        after it, and a retried append at or below it is answered, not stored again."""
        ...

    def append_all(self, appends: Sequence[Append]) -> list[AppendResult | ScalableTopicsError]:
        """Store each append whole or refuse it, in order; one answer per append."""
        ...

    def read(self, offset: int, max_records: int) -> list[StoredBatch]:
        """The stored batches from ``offset``, about ``max_records`` records."""
        ...

    @property
    def stable_end(self) -> int:
        """Where readers of committed data stop (``runtime.txn_visibility``)."""
        ...

    def read_committed(
        self, offset: int, max_records: int, end: int | None = None
    ) -> tuple[list[StoredBatch], int]:
        """The committed records from ``offset`` below ``end``, and where to read next."""
        ...

    def hidden_ranges(self, offset: int) -> list[tuple[int, int]]:
        """The ranges from ``offset`` on that no reader will get."""
        ...

    def terminate(self) -> None:
        """Seal: refuse every later append (idempotent)."""
        ...

    def retain(
        self, oldest_publish_ms: int | None, max_bytes: int | None, keep_from: int | None = None
    ) -> int:
        """Drop whole batches from the head by age and size, never one reaching
        ``keep_from``; the new ``start_offset``."""
        ...

    def sync(self) -> None:
        """Make every append so far durable."""
        ...

    def close(self) -> None: ...


def to_delivery(stored: list[StoredBatch]) -> pa.RecordBatch:
    """Concatenate stored batches into one batch with ``offset`` and ``publish_time`` columns."""
    if not stored:
        return empty_batch(DELIVERY_SCHEMA)
    columns: list[list[pa.Array]] = [[], [], []]
    for batch in stored:
        for i in range(3):
            columns[i].append(batch.records.column(i))
    sizes = [batch.records.num_rows for batch in stored]
    # Offsets run on across batches except where a read skips (queue redeliveries).
    offsets = np.concatenate(
        [np.arange(b.base_offset, b.base_offset + n) for b, n in zip(stored, sizes, strict=True)]
    ).astype(np.int64, copy=False)
    publish = np.repeat(np.array([b.publish_time_ms for b in stored], dtype=np.int64), sizes)
    arrays = [pa.concat_arrays(c) if len(c) > 1 else c[0] for c in columns]
    arrays.append(int64_array(offsets, pa.int64()))
    arrays.append(int64_array(publish, DELIVERY_SCHEMA.field("publish_time").type))
    return pa.RecordBatch.from_arrays(arrays, schema=DELIVERY_SCHEMA)
