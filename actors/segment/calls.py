"""``SegmentCalls``: the appends of an idempotent writer (``runtime.sink_writes.Segments``)
made on the segments' actors, with the writer's credential: the cluster's own for the
admin service storing a streaming sink's chunk, the user's for a Spark task."""

from __future__ import annotations

import pyarrow as pa
import ray

from actors.segment.lookup import find_segment_actor
from runtime.names import SegmentName
from runtime.remote import call


class SegmentCalls:
    """Sequenced appends to segments by name; each segment checks ``credential``."""

    def __init__(self, credential: str | None) -> None:
        self._credential = credential

    async def last_sequence(self, segment: str, producer_id: str) -> int:
        handle = await self._handle(segment)
        return await call(handle.last_sequence.remote(producer_id, credential=self._credential))

    async def append(
        self, segment: str, batch: pa.RecordBatch, producer_id: str, sequence: int
    ) -> None:
        handle = await self._handle(segment)
        await call(handle.append.remote(batch, producer_id, sequence, credential=self._credential))

    async def _handle(self, segment: str) -> ray.actor.ActorHandle:
        return await find_segment_actor(SegmentName.parse(segment), credential=self._credential)
