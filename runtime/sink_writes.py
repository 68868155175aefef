"""Idempotent writes: one chunk of records stored once, however often its writer runs it
again, and whatever the topic's layout did in between. Spark's batch sink
(``clients.spark.write_topic``) and its streaming sink (the REST ``writeStreamChunk``,
``actors.admin.stream_writes``) both store their chunks with ``write_chunk``.

A writer names each chunk by a key that a replay repeats: (query or write id,
partition, chunk number), and a batch number that grows with each streaming
micro-batch (0 for a batch write). The chunk's records go to each segment they route
to as one append, under the producer id of the chunk and a sequence on that segment.
Before anything is appended, the cluster records where each part goes
(``Ledger.open``: ``runtime.sink_parts.SinkWrite``); a replay finds that record
and asks each segment whether it stored its sequence (``last_sequence``), appending
only what is missing. A segment sealed by a split or merge before its part was stored
refused it whole (appends are atomic), so that part's hash range goes to the segments
that own it now, recorded first like the others (``Ledger.reroute``;
``runtime.sink_parts`` says why a part is a hash range, not a segment).

Only the last batch of each key is kept: a streaming query never replays a batch once
a later one started, so a write for an older batch is a duplicate by definition.

This module is the protocol only. Who keeps the record (the cluster's metadata store,
read directly by the admin service or through it by a Spark task) is a ``Ledger``;
how a part reaches its segment is ``Segments``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from runtime.errors import (
    AlreadyExistsError,
    BadVersion,
    InconsistentRequestError,
    InvalidArgumentError,
    SegmentTerminated,
)
from runtime.hashing import HASH_MASK, key_hashes, murmur3_32
from runtime.sink_parts import SinkPart, SinkWrite, in_append_order


@dataclass(frozen=True)
class Recorded:
    """A chunk's record as the cluster holds it: the write, the token a change to it must
    present (compare-and-swap), and the name of each segment its parts go to."""

    write: SinkWrite
    version: str
    segments: Mapping[int, str]


@dataclass(frozen=True)
class Opened:
    """What the cluster answers a writer starting a chunk: the record to carry out
    (``None``: the chunk's write of this batch, or of a later one, was stored whole),
    and whether an attempt before this one recorded it (so may have appended parts)."""

    recorded: Recorded | None
    resumed: bool


class Ledger(Protocol):
    """The cluster's record of one chunk (one key). A change made on a stale record raises
    ``BadVersion`` or ``AlreadyExistsError``: another attempt of the chunk moved first."""

    async def open(self, batch: int, hashes: np.ndarray) -> Opened:
        """The chunk's record for ``batch``: the one an earlier attempt left, else a new one
        saying where each record goes, sequenced after what the segments hold of the
        chunk's producer (replacing the record of an older batch)."""

    async def reroute(self, recorded: Recorded, part: SinkPart, hashes: np.ndarray) -> Recorded:
        """Give the range of ``part``, refused by its sealed segment, to its owners now."""

    async def finish(self, recorded: Recorded) -> None:
        """Mark the write stored whole."""


class Segments(Protocol):
    """Appends to segments by name, presenting the writer's credential."""

    async def last_sequence(self, segment: str, producer_id: str) -> int:
        """The highest sequence ``segment`` stored for ``producer_id`` (-1: none)."""

    async def append(
        self, segment: str, batch: pa.RecordBatch, producer_id: str, sequence: int
    ) -> None:
        """Append ``batch`` under ``producer_id`` and ``sequence``; ``SegmentTerminated``
        when the segment is sealed."""


# A chunk's record travels between the cluster and a writer as a document (the writer
# may be a JVM, over REST), sent back by the writer as it came.


def recorded_document(recorded: Recorded) -> dict[str, Any]:
    return {
        "write": recorded.write.model_dump(mode="json"),
        "version": recorded.version,
        "segments": {str(segment): name for segment, name in recorded.segments.items()},
    }


def recorded_of(document: Mapping[str, Any]) -> Recorded:
    """A record a writer sent back; the store's compare-and-swap on its version decides
    whether it is still the chunk's record. Refused: not a record's shape (400), or a
    shape whose values cannot be a record (409 ``inconsistent``: a hash range that ends
    before it starts, which a request schema cannot state)."""
    try:
        write, version = document["write"], document["version"]
        if not isinstance(version, str) or not isinstance(write, Mapping):
            raise TypeError("write must be an object and version a string")
        int(version.rpartition(":")[2])  # the store's token: "generation:sequence"
        names = {int(s): str(name) for s, name in dict(document.get("segments", {})).items()}
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidArgumentError(f"recorded is not a chunk record: {err}") from None
    return Recorded(write=_model(SinkWrite, write, "recorded"), version=version, segments=names)


def part_of(document: Mapping[str, Any]) -> SinkPart:
    return _model(SinkPart, document, "part")


_M = TypeVar("_M", SinkWrite, SinkPart)


def _model(model: type[_M], document: Any, what: str) -> _M:
    try:
        return model.model_validate(document)
    except (ValueError, ValidationError) as err:
        message = " ".join(str(err).split())
        raise InconsistentRequestError(f"{what} cannot be a chunk's: {message}") from None


def producer_id(query: str, partition: int, chunk: int) -> str:
    """The producer a chunk's appends are made under, the same on every replay."""
    return f"sink:{query}:{partition}:{chunk}"


def routing_hashes(keys: pa.Array, partition: int, chunk: int) -> np.ndarray:
    """Each record's hash: its key's, as every producer routes; a record without a key
    gets one from its place in the write, so a replay routes it the same way."""
    hashes = key_hashes(keys).astype(np.int64)
    for i in np.flatnonzero(hashes < 0):
        hashes[i] = murmur3_32(f"{partition}:{chunk}:{i}".encode()) & HASH_MASK
    return hashes


async def write_chunk(
    ledger: Ledger,
    segments: Segments,
    producer: str,
    batch: int,
    records: pa.RecordBatch,
    hashes: np.ndarray,
    *,
    after: Awaitable[object] | None = None,
    appended: asyncio.Future[None] | None = None,
) -> dict[str, int | bool]:
    """Store ``records`` (routed by ``hashes``) unless this chunk's write of ``batch`` was
    stored before: ``{"stored": rows newly stored, "duplicate": nothing of it was new}``.

    A writer of several chunks in order may overlap them: ``after`` (the previous
    chunk's ``appended``) holds this chunk's appends until the previous chunk's are all
    made, so each segment gets the chunks in order and per-key order holds across
    them, while this chunk's record is opened and the previous one's finished
    meanwhile. ``appended`` is resolved once this chunk's parts are appended, or with
    the error that stopped it."""
    try:
        while True:
            try:
                opened = await ledger.open(batch, hashes)
                if opened.recorded is None:
                    _resolve(appended)
                    return {"stored": 0, "duplicate": True}
                if after is not None:
                    await _earlier(after)
                recorded, stored = await _carry_out(
                    ledger, segments, producer, opened.recorded, records, hashes, opened.resumed
                )
                _resolve(appended)
                await ledger.finish(recorded)
                return {"stored": stored, "duplicate": opened.resumed and stored == 0}
            except (BadVersion, AlreadyExistsError):
                continue  # another attempt of the same chunk moved first: look again
    except BaseException as err:
        if appended is not None and not appended.done():
            appended.set_exception(err)
        raise


class EarlierChunkFailed(Exception):
    """A chunk was not appended because the one before it (``after``) failed."""


async def _earlier(after: Awaitable[object]) -> None:
    """Wait for the previous chunk's appends; its failure becomes this chunk's own error
    (``EarlierChunkFailed``, caused by it), never the same exception raised twice."""
    try:
        await after
    except Exception as err:
        raise EarlierChunkFailed(f"an earlier chunk was not stored: {err}") from err


def _resolve(appended: asyncio.Future[None] | None) -> None:
    if appended is not None and not appended.done():
        appended.set_result(None)


async def _carry_out(
    ledger: Ledger,
    segments: Segments,
    producer: str,
    recorded: Recorded,
    records: pa.RecordBatch,
    hashes: np.ndarray,
    resumed: bool,
) -> tuple[Recorded, int]:
    """Append each part (the record, rerouted on the way, and the rows newly stored); a
    ``resumed`` write first asks whether a part got there before
    (a new one was sequenced after what the segments hold, so none has).

    The segments are written at once, each its parts in sequence order: a round
    appends the next part of every segment that has one; the parts refused by a sealed
    segment are then given to the owners of their ranges, for the next rounds."""
    stored = 0
    pending = in_append_order(recorded.write.parts)
    while pending:
        firsts: dict[int, SinkPart] = {}
        for part in pending:
            firsts.setdefault(part.segment, part)
        round_parts = list(firsts.values())
        pending = [part for part in pending if part not in round_parts]
        results = await asyncio.gather(
            *(
                _append(segments, producer, recorded.segments[part.segment], part, records,
                        hashes, resumed)
                for part in round_parts
            ),
            return_exceptions=True,
        )  # fmt: skip
        for part, result in zip(round_parts, results, strict=True):
            if isinstance(result, SegmentTerminated):
                held = set(recorded.write.parts)
                recorded = await ledger.reroute(recorded, part, hashes)
                moved = [p for p in recorded.write.parts if p not in held]
                pending = in_append_order([*pending, *moved])
            elif isinstance(result, BaseException):
                raise result
            else:
                stored += result
    return recorded, stored


async def _append(
    segments: Segments,
    producer: str,
    segment: str,
    part: SinkPart,
    records: pa.RecordBatch,
    hashes: np.ndarray,
    resumed: bool,
) -> int:
    """This part's append, unless its segment has it already; rows newly stored."""
    rows = part.rows(hashes)
    if len(rows) == 0:
        return 0
    if resumed and await segments.last_sequence(segment, producer) >= part.sequence:
        return 0
    await segments.append(segment, records.take(pa.array(rows)), producer, part.sequence)
    return len(rows)
