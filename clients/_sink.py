"""What a Spark batch write's task stores its chunks with (``runtime.sink_writes``): the
record of each chunk kept by the cluster, reached through its admin service
(``ClusterLedger``; ``actors.admin.stream_writes.CatalogLedger`` is the other side), and
the parts appended straight to their segments over the data plane (``DataPlaneSegments``),
as a producer's batches are. The admin service and the segments check the writer's
credential (``produce``) on every call."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from actors.admin.caller import AdminServiceCaller
from actors.segment.calls import SegmentCalls
from clients._data_plane import SegmentChannel
from runtime.batch import make_batch, serialize_batch
from runtime.sink_parts import SinkPart
from runtime.sink_writes import (
    Opened,
    Recorded,
    producer_id,
    recorded_document,
    recorded_of,
    routing_hashes,
    write_chunk,
)


class ClusterLedger:
    """``runtime.sink_writes.Ledger`` of chunk ``chunk`` of partition ``partition`` of the
    write ``query`` to ``topic``."""

    def __init__(
        self,
        service: AdminServiceCaller,
        topic: str,
        query: str,
        partition: int,
        chunk: int,
        credential: str | None,
    ) -> None:
        self._service, self._credential = service, credential
        self._key = (topic, query, partition, chunk)

    async def open(self, batch: int, hashes: np.ndarray) -> Opened:
        opened = await self._call("sink_open", batch, hashes)
        found = opened["recorded"]
        return Opened(None if found is None else recorded_of(found), opened["resumed"])

    async def reroute(self, recorded: Recorded, part: SinkPart, hashes: np.ndarray) -> Recorded:
        document = recorded_document(recorded)
        moved = await self._call("sink_reroute", document, part.model_dump(mode="json"), hashes)
        return recorded_of(moved)

    async def finish(self, recorded: Recorded) -> None:
        await self._call("sink_finish", recorded_document(recorded))

    async def _call(self, operation: str, *args: Any) -> Any:
        return await self._service.call(operation, *self._key, *args, credential=self._credential)


class DataPlaneSegments(SegmentCalls):
    """``runtime.sink_writes.Segments`` whose appends go over the segments' data planes:
    one channel per segment, kept across the chunks of a task, closed by ``close``."""

    def __init__(self, credential: str | None) -> None:
        super().__init__(credential)
        self._channels: dict[str, SegmentChannel] = {}

    async def append(
        self, segment: str, batch: pa.RecordBatch, producer_id: str, sequence: int
    ) -> None:
        channel = self._channels.get(segment)
        if channel is None:
            channel = SegmentChannel(await self._handle(segment), credential=self._credential)
            self._channels[segment] = channel
        await channel.append(producer_id, sequence, serialize_batch(batch))

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


async def write_chunks(
    service: AdminServiceCaller,
    topic: str,
    query: str,
    partition: int,
    credential: str | None,
    chunks: Iterator[pa.RecordBatch],
    segments: DataPlaneSegments | None = None,
    in_flight: int = 2,
) -> tuple[int, bool]:
    """Store ``chunks`` (batches with ``key``, ``value`` and ``properties`` columns, numbered
    from 0) in order, each once, under the write ``query``'s ``partition``: the rows
    written, and whether some chunk had been stored before (by an earlier attempt).

    Up to ``in_flight`` chunks overlap: the next chunk's record is opened and the last
    one's finished while a chunk's parts are appended (``write_chunk``'s ``after``), so
    the task waits on the segments, not on round trips. ``chunks`` is read on an
    executor thread (Spark's rows arrive through it). ``segments``: where the parts go
    (by default over the data planes with ``credential``); closed at the end."""
    loop = asyncio.get_running_loop()
    segments = segments or DataPlaneSegments(credential)
    running: deque[tuple[asyncio.Task[dict[str, Any]], int]] = deque()
    previous: asyncio.Future[None] | None = None
    rows, retried = 0, False
    try:
        for number in itertools.count():
            chunk = await loop.run_in_executor(None, next, chunks, None)
            if chunk is None:
                break
            values, keys = chunk.column("value"), chunk.column("key")
            records = make_batch(values, keys, chunk.column("properties"))
            hashes = routing_hashes(records.column("key"), partition, number)
            ledger = ClusterLedger(service, topic, query, partition, number, credential)
            appended: asyncio.Future[None] = loop.create_future()
            producer = producer_id(query, partition, number)
            write = write_chunk(
                ledger, segments, producer, 0, records, hashes, after=previous, appended=appended
            )
            running.append((loop.create_task(write), records.num_rows))
            previous, rows = appended, rows + records.num_rows
            while len(running) > in_flight:
                retried = await _stored_before(*running.popleft()) or retried
        while running:
            retried = await _stored_before(*running.popleft()) or retried
    finally:
        for task, _ in running:  # after a failure: the chunks behind it fail on their own
            task.cancel()
        await asyncio.gather(*(task for task, _ in running), return_exceptions=True)
        if previous is not None and previous.done() and not previous.cancelled():
            previous.exception()  # the last chunk's failure, raised by that chunk itself
        await segments.close()
    return rows, retried


async def _stored_before(task: asyncio.Task[dict[str, Any]], rows: int) -> bool:
    """Wait for a chunk; whether some of its rows were stored by an earlier attempt."""
    return (await task)["stored"] < rows
