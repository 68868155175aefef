"""Idempotent streaming writes: a Spark streaming sink's micro-batch is stored once,
however often Spark replays it, and whatever the topic's layout did in between.

Spark replays a micro-batch whose commit it did not record (a driver or task
killed mid-batch), with the same query id, batch id and partition, and the same
rows when the pipeline is deterministic. Each write (one chunk of one partition
of one batch) is one append per segment it routes to, under the producer id
``sink:{query}:{partition}:{chunk}`` and the next sequence of that producer on
that segment. Before appending, the write records those sequences in metadata
(``storage.records.SinkWrite``); a replay then asks each of those segments
whether it stored its sequence (``last_sequence``) and appends only what is
missing. A segment sealed by a split or merge before its part was stored
refused it whole (appends are atomic), so that part's hash range goes to the
segments that own it now, recorded first like the others (``runtime.sink_parts``
says why a part is a hash range, not a segment).

Only the last write of each (query, partition, chunk) is kept: Spark never
replays a batch once a later one started, so a write for an older batch is a
duplicate by definition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from actors.guard import guard
from actors.segment.lookup import find_segment_actor
from runtime.batch import make_batch
from runtime.errors import AlreadyExistsError, BadVersion, SegmentTerminated
from runtime.hashing import HASH_MASK, key_hashes, murmur3_32
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from runtime.remote import call
from runtime.sink_parts import Piece, SinkPart, in_append_order, owned_pieces, with_sequences
from storage.catalog import Catalog
from storage.records import SinkWrite

Record = tuple[str | None, bytes, dict[str, str] | None]


async def stream_write(
    catalog: Catalog,
    name: TopicName,
    query: str,
    batch: int,
    partition: int,
    chunk: int,
    records: Sequence[Record],
) -> dict[str, Any]:
    """Store ``records`` unless this write was stored before; ``{"stored": n,
    "duplicate": bool}`` (``duplicate``: nothing of it was new)."""
    writer = _Write(catalog, name, query, partition, chunk)
    hashes = _routing_hashes(records, partition, chunk)
    while True:
        found = catalog.sink_write(name, query, partition, chunk)
        if found is not None and (
            found[0].batch > batch or (found[0].batch == batch and found[0].done)
        ):
            return {"stored": 0, "duplicate": True}
        try:
            if found is None or found[0].batch < batch:
                write = await writer.begin(batch, hashes, found[1] if found else None)
            else:
                write = found
            resumed = found is not None and found[0].batch == batch
            stored = await writer.carry_out(write, records, hashes, resumed)
            return {"stored": stored, "duplicate": resumed and stored == 0}
        except (BadVersion, AlreadyExistsError):
            continue  # another attempt of the same write moved first: look again


class _Write:
    """One (query, partition, chunk): its producer id and its metadata record."""

    def __init__(
        self, catalog: Catalog, name: TopicName, query: str, partition: int, chunk: int
    ) -> None:
        self.catalog, self.name = catalog, name
        self.key = (query, partition, chunk)
        self.producer_id = f"sink:{query}:{partition}:{chunk}"

    async def begin(self, batch: int, hashes: np.ndarray, expected: Any) -> tuple[SinkWrite, Any]:
        """Record where each part of a new write goes, before anything is appended."""
        layout = self.catalog.require_topic(self.name).layout
        parts = await self._parts(layout, owned_pieces(layout, hashes), ())
        write = SinkWrite(batch=batch, parts=tuple(parts))
        version = self.catalog.put_sink_write(self.name, *self.key, write, expected)
        return write, version

    async def carry_out(
        self,
        found: tuple[SinkWrite, Any],
        records: Sequence[Record],
        hashes: np.ndarray,
        resumed: bool,
    ) -> int:
        """Append each part; a ``resumed`` write first asks whether a part got there before
        (a new one just read its segments' sequences, so none has)."""
        write, version = found
        stored = 0
        pending = in_append_order(write.parts)
        layout = self.catalog.require_topic(self.name).layout
        while pending:
            part = pending.pop(0)
            try:
                stored += await self._append(layout, part, records, hashes, resumed)
            except SegmentTerminated:
                # sealed before this part got there: its range goes to that range's owners
                layout = self.catalog.require_topic(self.name).layout
                kept = [p for p in write.parts if p != part]
                moved = await self._parts(
                    layout, owned_pieces(layout, hashes, part.hash_range), kept
                )
                write = SinkWrite(batch=write.batch, parts=(*kept, *moved))
                version = self.catalog.put_sink_write(self.name, *self.key, write, version)
                pending = in_append_order([*pending, *moved])
        done = SinkWrite(batch=write.batch, parts=write.parts, done=True)
        self.catalog.put_sink_write(self.name, *self.key, done, version)
        return stored

    async def _parts(
        self, layout: SegmentLayout, pieces: list[Piece], held: Sequence[SinkPart]
    ) -> list[SinkPart]:
        """Parts for ``pieces``, sequenced after this producer's last on each segment."""
        segments = sorted({segment_id for segment_id, _ in pieces})
        lasts = await asyncio.gather(*(self._last(layout, s) for s in segments))
        return with_sequences(pieces, dict(zip(segments, lasts, strict=True)), held)

    async def _last(self, layout: SegmentLayout, segment_id: int) -> int:
        handle = await _handle(self.name, layout, segment_id)
        return await call(handle.last_sequence.remote(self.producer_id, credential=_internal()))

    async def _append(
        self,
        layout: SegmentLayout,
        part: SinkPart,
        records: Sequence[Record],
        hashes: np.ndarray,
        resumed: bool,
    ) -> int:
        """This part's append, unless the segment has it already; rows newly stored."""
        rows = part.rows(hashes)
        if len(rows) == 0 or (resumed and await self._last(layout, part.segment) >= part.sequence):
            return 0
        handle = await _handle(self.name, layout, part.segment)
        picked = [records[i] for i in rows]
        batch = make_batch(
            [value for _, value, _ in picked],
            [key for key, _, _ in picked],
            [properties for _, _, properties in picked],
        )
        sequence = part.sequence
        await call(handle.append.remote(batch, self.producer_id, sequence, credential=_internal()))
        return len(rows)


def _routing_hashes(records: Sequence[Record], partition: int, chunk: int) -> np.ndarray:
    """Each record's hash: its key's, as every producer routes; a record without a key
    gets one from its place in the write, so a replay routes it the same way."""
    keys = pa.array([key for key, _, _ in records], type=pa.string())
    hashes = key_hashes(keys).astype(np.int64)
    for i in np.flatnonzero(hashes < 0):
        hashes[i] = murmur3_32(f"{partition}:{chunk}:{i}".encode()) & HASH_MASK
    return hashes


async def _handle(name: TopicName, layout: SegmentLayout, segment_id: int) -> Any:
    return await find_segment_actor(
        layout.get(segment_id).name(name), credential=guard().internal_token()
    )


def _internal() -> str | None:
    return guard().internal_token()
