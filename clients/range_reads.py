"""Reading one offset range of a segment, as a snapshot read's task does: the unit
``clients.read_plan`` plans, run by Spark's executors (``clients.spark``) and Ray Data's
read tasks (``clients.ray_data``).

A range is read from its segment's actor, one read in flight ahead of the one being
converted, riding out a restart of the actor for a bounded time; a tiered segment's
range is read from its file in the tier, with no actor involved. Every batch comes out
in ``OUTPUT_SCHEMA``: the stored columns plus the routing hash and the segment id.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    GetTimeoutError,
    RayTaskError,
)

from actors.segment.lookup import segment_actor
from actors.segment.reader import MAX_READ_RECORDS
from runtime.batch import PROPERTIES_TYPE, following
from runtime.errors import (
    NotLeaderError,
    ScalableTopicsError,
    UnavailableError,
    UnavailableSegmentsError,
)
from runtime.hashing import key_hashes
from runtime.names import SegmentName
from runtime.remote import ACTOR_GONE
from runtime.uris import redacted
from storage.log import to_delivery
from storage.tier import TieredSegment, open_tier

# Pause between attempts to reach a segment whose actor is restarting.
RETRY_PAUSE_S = 0.2
RESTART_ERRORS = (ActorDiedError, ActorUnavailableError, *ACTOR_GONE, GetTimeoutError)

OUTPUT_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("value", pa.binary()),
        ("hash", pa.int32()),
        ("segment_id", pa.int64()),
        ("offset", pa.int64()),
        ("publish_time", pa.timestamp("us", tz="UTC")),
        ("properties", PROPERTIES_TYPE),
    ]
)


@dataclass(frozen=True)
class TierFile:
    """A tiered segment's records file: what a range of it is read from, no actor involved."""

    uri: str = field(repr=False)  # the tier, as its policy named it (never shown)
    path: str  # the Parquet file in that tier
    start: int  # the file's first offset, and its end
    end: int
    format: int  # ``storage.tier.TIER_FORMAT`` it was written in


@dataclass(frozen=True)
class SegmentRange:
    """Offsets ``[start, end)`` of one segment: the unit of one read task / Spark partition.
    ``tier``: the segment is tiered, and the range is read from that file."""

    segment: str
    segment_id: int
    start: int
    end: int
    tier: TierFile | None = None

    @property
    def rows(self) -> int:
        return self.end - self.start


def read_range(
    piece: SegmentRange, timeout_s: float, credential: str | None = None
) -> Iterator[pa.RecordBatch]:
    """The records of ``piece`` as ``OUTPUT_SCHEMA`` batches, one actor read in flight ahead
    (each read presents ``credential``).

    Rides out a restart of the segment actor for up to ``timeout_s`` per outage;
    raises ``UnavailableSegmentsError`` when it does not come back, or when the
    segment has no records where the snapshot saw some (its storage was lost).
    Records below the segment's start offset were dropped by retention on purpose
    and are skipped, as every reader skips them.
    """
    if piece.tier is not None:
        yield from _read_tiered(piece)
        return
    segment = SegmentName.parse(piece.segment)
    reader = _RangeReader(segment, piece, timeout_s, credential)
    offset = piece.start
    pending = reader.request(offset)
    while offset < piece.end:
        batch = reader.receive(pending, offset)
        offset = following(batch, offset)  # past any records no reader gets
        if offset < piece.end:
            pending = reader.request(offset)  # let the actor read on while we convert
        if batch.num_rows:
            yield _with_derived_columns(batch, piece.segment_id)


def _read_tiered(piece: SegmentRange) -> Iterator[pa.RecordBatch]:
    """The records of a tiered segment's range, from its file in the tier."""
    assert piece.tier is not None
    try:
        filesystem, _ = open_tier(piece.tier.uri)
        tiered = TieredSegment(filesystem, piece.tier.path.rsplit("/", 1)[0])
        offset = piece.start
        while offset < piece.end:
            stored = tiered.read(offset, min(MAX_READ_RECORDS, piece.end - offset))
            if not stored:
                raise OSError(f"no records at offset {offset}, the manifest says {piece.end}")
            batch = to_delivery(stored)
            offset = batch.column("offset")[batch.num_rows - 1].as_py() + 1
            yield _with_derived_columns(_trim(batch, piece.end), piece.segment_id)
    except (OSError, UnavailableError) as err:
        raise UnavailableSegmentsError(
            f"segment {piece.segment_id} ({piece.segment}) could not be read from its tier: "
            f"{str(err).replace(piece.tier.uri, redacted(piece.tier.uri))}",
            [piece.segment_id],
        ) from None


class _RangeReader:
    """Actor calls for one range, with bounded waits through actor restarts."""

    def __init__(
        self, segment: SegmentName, piece: SegmentRange, timeout_s: float, credential: str | None
    ) -> None:
        self.segment = segment
        self.piece = piece
        self.timeout_s = timeout_s
        self.credential = credential
        self.handle: Any = None

    def request(self, offset: int) -> ray.ObjectRef | None:
        try:
            self.handle = self.handle or segment_actor(self.segment)
        except ValueError:
            return None  # receive() waits for the actor to come back
        count = min(MAX_READ_RECORDS, self.piece.end - offset)
        return self.handle.read.remote(offset, count, credential=self.credential)

    def receive(self, pending: ray.ObjectRef | None, offset: int) -> pa.RecordBatch:
        """Records from ``offset`` (or from the start offset, if retention passed it) up to
        the range's end; empty only when retention dropped everything up to the end."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                if pending is None:
                    raise ValueError("no actor")
                batch = _answer(pending, deadline)
            except (ValueError, NotLeaderError, *RESTART_ERRORS) as err:
                self.handle = None
                if time.monotonic() + RETRY_PAUSE_S >= deadline:
                    why = f"did not answer within {self.timeout_s:g}s: {err}"
                    raise self._unavailable(why) from None
                time.sleep(RETRY_PAUSE_S)
                pending = self.request(offset)
                continue
            if batch.num_rows == 0 and following(batch, offset) <= offset:
                raise self._unavailable(
                    f"returned no records at offset {offset}, but the snapshot saw records "
                    f"up to {self.piece.end}: its storage was lost or replaced"
                )
            return _trim(batch, self.piece.end)

    def _unavailable(self, why: str) -> UnavailableSegmentsError:
        return UnavailableSegmentsError(
            f"segment {self.piece.segment_id} ({self.segment}) {why}", [self.piece.segment_id]
        )


def _answer(pending: ray.ObjectRef, deadline: float) -> pa.RecordBatch:
    """The read's records; the segment's own error (a refusal, say) as itself: a
    ``NotLeaderError`` is a replicated segment's replica that no longer leads it, which
    the caller looks up again."""
    try:
        return ray.get(pending, timeout=max(deadline - time.monotonic(), 0.001))
    except RayTaskError as err:
        if isinstance(err.cause, ScalableTopicsError):
            raise err.cause from None
        raise


def _trim(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
    offsets = batch.column("offset").to_numpy()
    keep = int(np.searchsorted(offsets, end))
    return batch if keep == batch.num_rows else batch.slice(0, keep)


def _with_derived_columns(batch: pa.RecordBatch, segment_id: int) -> pa.RecordBatch:
    """Add the routing hash and the segment id; timestamps in microseconds, as Spark's."""
    keys = batch.column("key")
    hashes = key_hashes(keys)
    hash_column = pa.array(hashes, type=pa.int32(), mask=hashes < 0)
    segment_column = pa.array(np.full(batch.num_rows, segment_id, dtype=np.int64))
    publish_time = batch.column("publish_time").cast(OUTPUT_SCHEMA.field("publish_time").type)
    return pa.RecordBatch.from_arrays(
        [
            keys,
            batch.column("value"),
            hash_column,
            segment_column,
            batch.column("offset"),
            publish_time,
            batch.column("properties"),
        ],
        schema=OUTPUT_SCHEMA,
    )
