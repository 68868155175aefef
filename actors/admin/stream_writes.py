"""The cluster's side of idempotent writes (``runtime.sink_writes``): the record of each
chunk in the metadata store, and the streaming sink's whole write.

``CatalogLedger`` keeps one chunk's record (``storage.catalog``, ``SinkWrite`` under the
topic's ``sinks/`` path): it decides where each part goes from the layout it reads, and
its sequences from what the segments hold of the chunk's producer. The admin service
uses it directly to store a streaming sink's chunk that came over REST
(``stream_write``), and on behalf of a Spark task that appends its parts itself
(the ``sink_*`` operations of ``actors.admin.stream_service``), so a batch write's rows
go from the task to their segments without passing through this service. The JVM's
streaming sink does the same over REST. Either writer gets the record as a document
(``opened_document``) that it sends back as is (``runtime.sink_writes.recorded_of``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from actors.guard import guard
from actors.segment.calls import SegmentCalls
from runtime.batch import make_batch
from runtime.errors import InvalidArgumentError
from runtime.hashing import HASH_MASK
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from runtime.sink_parts import Piece, SinkPart, SinkWrite, owned_pieces, with_sequences
from runtime.sink_writes import (
    Opened,
    Recorded,
    Segments,
    producer_id,
    recorded_document,
    routing_hashes,
    write_chunk,
)
from storage.catalog import Catalog
from storage.metadata import Version

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
    """Store a streaming sink's chunk unless it was stored before; ``{"stored": n,
    "duplicate": bool}`` (``duplicate``: nothing of it was new)."""
    rows = make_batch(
        [value for _, value, _ in records],
        [key for key, _, _ in records],
        [properties for _, _, properties in records],
    )
    hashes = routing_hashes(rows.column("key"), partition, chunk)
    internal = SegmentCalls(guard().internal_token())
    ledger = CatalogLedger(catalog, internal, name, query, partition, chunk)
    return await write_chunk(
        ledger, internal, producer_id(query, partition, chunk), batch, rows, hashes
    )


class CatalogLedger:
    """``runtime.sink_writes.Ledger`` for one chunk, kept in the metadata store; the
    sequences of new parts follow what ``segments`` (asked with the cluster's own
    credential) hold of the chunk's producer."""

    def __init__(
        self,
        catalog: Catalog,
        segments: Segments,
        name: TopicName,
        query: str,
        partition: int,
        chunk: int,
    ) -> None:
        self.catalog, self.segments, self.name = catalog, segments, name
        self.key = (query, partition, chunk)
        self.producer_id = producer_id(query, partition, chunk)

    async def open(self, batch: int, hashes: np.ndarray) -> Opened:
        found = self.catalog.sink_write(self.name, *self.key)
        if found is None:
            return Opened(await self._begin(batch, hashes, None), resumed=False)
        write, version = found
        if write.batch > batch or (write.batch == batch and write.done):
            return Opened(None, resumed=True)
        if write.batch == batch:
            return Opened(self._recorded(write, version, self._layout()), resumed=True)
        return Opened(await self._begin(batch, hashes, version), resumed=False)

    async def _begin(self, batch: int, hashes: np.ndarray, replaces: Version | None) -> Recorded:
        """Record where each record goes. With no record before it, nothing was appended
        under the chunk's producer (the record always comes first), so its sequences
        start at 0 without asking the segments."""
        layout = self._layout()
        pieces = owned_pieces(layout, hashes)
        if replaces is None:
            parts = with_sequences(pieces, {segment_id: -1 for segment_id, _ in pieces})
        else:
            parts = await self._parts(layout, pieces, ())
        write = SinkWrite(batch=batch, parts=tuple(parts))
        version = self.catalog.put_sink_write(self.name, *self.key, write, replaces)
        return self._recorded(write, version, layout)

    async def reroute(self, recorded: Recorded, part: SinkPart, hashes: np.ndarray) -> Recorded:
        layout = self._layout()
        kept = [p for p in recorded.write.parts if p != part]
        moved = await self._parts(layout, owned_pieces(layout, hashes, part.hash_range), kept)
        write = SinkWrite(batch=recorded.write.batch, parts=(*kept, *moved))
        return self._put(write, recorded, layout)

    async def finish(self, recorded: Recorded) -> None:
        write = recorded.write
        done = SinkWrite(batch=write.batch, parts=write.parts, done=True)
        self._put(done, recorded, None)

    def _put(
        self, write: SinkWrite, replaces: Recorded | None, layout: SegmentLayout | None
    ) -> Recorded:
        expected = None if replaces is None else _version(replaces.version)
        version = self.catalog.put_sink_write(self.name, *self.key, write, expected)
        return self._recorded(write, version, layout)

    def _recorded(
        self, write: SinkWrite, version: Version, layout: SegmentLayout | None
    ) -> Recorded:
        names = (
            {p.segment: str(layout.get(p.segment).name(self.name)) for p in write.parts}
            if layout is not None
            else {}
        )
        return Recorded(write=write, version=str(version), segments=names)

    def _layout(self) -> SegmentLayout:
        return self.catalog.require_topic(self.name).layout

    async def _parts(
        self, layout: SegmentLayout, pieces: list[Piece], held: Sequence[SinkPart]
    ) -> list[SinkPart]:
        """Parts for ``pieces``, sequenced after this producer's last on each segment."""
        segments = sorted({segment_id for segment_id, _ in pieces})
        lasts = await asyncio.gather(
            *(
                self.segments.last_sequence(str(layout.get(s).name(self.name)), self.producer_id)
                for s in segments
            )
        )
        return with_sequences(pieces, dict(zip(segments, lasts, strict=True)), held)


def _version(token: str) -> Version:
    """The store's CAS token back from the string a writer holds (its ``str``)."""
    generation, _, seq = token.rpartition(":")
    return Version(generation, int(seq))


async def opened_document(ledger: CatalogLedger, opened: Opened) -> dict[str, Any]:
    """A chunk's record for a writer outside Ray: the record to carry out (``None``: the
    chunk was stored before), the producer id its appends go under, and, when an earlier
    attempt recorded it, the last sequence each of its segments holds of that producer:
    a part at or below it was stored, and must not be rerouted if its segment is sealed
    since (``runtime.sink_writes._append`` asks the same of the segments)."""
    recorded = opened.recorded
    lasts: dict[str, int] = {}
    if recorded is not None and opened.resumed:
        segments = sorted({part.segment for part in recorded.write.parts})
        found = await asyncio.gather(
            *(ledger.segments.last_sequence(recorded.segments[s], ledger.producer_id)
              for s in segments)
        )  # fmt: skip
        lasts = {str(s): last for s, last in zip(segments, found, strict=True)}
    return {
        "recorded": None if recorded is None else recorded_document(recorded),
        "resumed": opened.resumed,
        "producerId": ledger.producer_id,
        "lastSequences": lasts,
    }


def hashes_of(hashes: Any) -> np.ndarray:
    """A writer's routing hashes, refused unless they are hashes (a list or array of
    integers within the hash space)."""
    array = np.asarray(hashes)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise InvalidArgumentError("hashes must be a one-dimensional array of integers")
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() > HASH_MASK):
        raise InvalidArgumentError(f"hashes must lie within 0..{HASH_MASK}")
    return array
