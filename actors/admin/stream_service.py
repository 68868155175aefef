"""The admin service's data-pipeline operations, what Spark's sources and sinks call
(the streaming ones through the REST gateway): planning micro-batches
(``actors.admin.stream_reads``), storing a streaming sink's chunk once
(``actors.admin.stream_writes``), the records through which a batch write's tasks store
their chunks once themselves (``runtime.sink_writes``), and planning the snapshot reads
of ``read_topic`` and Ray Data (``actors.admin.snapshot_reads``). Clients never read the
metadata store themselves: each of these checks the caller's credential first.

A mixin of ``actors.admin.service.AdminService``, which provides ``_guard`` and
``_catalog``; each method's caller is checked as the Admin API table says
(``actors.admin.permits``) before it runs.
"""

from __future__ import annotations

from typing import Any

from actors.admin.permits import admin_operation
from actors.admin.snapshot_reads import plan_snapshot
from actors.admin.stream_reads import stream_endpoint, stream_initial, stream_latest, stream_ranges
from actors.admin.stream_writes import CatalogLedger, hashes_of, opened_document, stream_write
from actors.guard import Guard
from actors.segment.calls import SegmentCalls
from runtime.admin_api import Ordinal, Seconds, SegmentId
from runtime.names import TopicName, validate_part
from runtime.sink_writes import part_of, recorded_document, recorded_of
from storage.catalog import Catalog


class StreamOperations:
    _catalog: Catalog
    _guard: Guard

    @admin_operation
    async def stream_initial(
        self,
        name: TopicName,
        starting: str | dict[str, int] | None = None,
        starting_time_ms: int | None = None,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        return await stream_initial(self._catalog, name, starting, starting_time_ms)

    @admin_operation
    async def stream_latest(
        self,
        name: TopicName,
        start: dict[str, Any],
        max_messages: int | None = None,
        until: dict[str, Any] | None = None,
        fail_on_data_loss: bool = True,
        max_bytes: int | None = None,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        return await stream_latest(
            self._catalog, name, start, max_messages, until, fail_on_data_loss, max_bytes
        )

    @admin_operation
    async def stream_ranges(
        self,
        name: TopicName,
        start: dict[str, Any],
        end: dict[str, Any],
        fail_on_data_loss: bool = True,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        return await stream_ranges(self._catalog, name, start, end, fail_on_data_loss)

    @admin_operation
    async def stream_write(
        self,
        name: TopicName,
        query: str,
        batch: Ordinal,
        partition: Ordinal,
        chunk: Ordinal,
        records: list[tuple[str | None, bytes, dict[str, str] | None]],
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """One chunk of a streaming sink's micro-batch partition, stored once however often
        it is replayed (``actors.admin.stream_writes``)."""
        return await stream_write(self._catalog, name, query, batch, partition, chunk, records)

    @admin_operation
    async def stream_endpoint(
        self, name: TopicName, segment_id: SegmentId, *, credential: str | None = None
    ) -> dict[str, Any]:
        return await stream_endpoint(self._catalog, name, segment_id)

    @admin_operation
    async def plan_snapshot(
        self,
        name: TopicName,
        start: Any = "earliest",
        end: Any = "latest",
        subscription: str | None = None,
        unavailable_timeout_s: Seconds = 20.0,
        allow_partial: bool = False,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """The ranges of a snapshot read (``actors.admin.snapshot_reads``)."""
        return await plan_snapshot(
            self._catalog, name, start, end, subscription, unavailable_timeout_s, allow_partial
        )

    # --- a writer's idempotent write (a Spark task: the batch sink's in Python, the
    # streaming sink's in the JVM over REST): the cluster keeps the record of each chunk,
    # handed to the writer as a document it sends back; the writer appends the chunk's
    # parts to their segments itself (runtime.sink_writes, actors.admin.stream_writes)

    @admin_operation
    async def sink_open(
        self,
        name: TopicName,
        query: str,
        partition: Ordinal,
        chunk: Ordinal,
        batch: Ordinal,
        hashes: Any,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        ledger = self._ledger(name, query, partition, chunk)
        return await opened_document(ledger, await ledger.open(batch, hashes_of(hashes)))

    @admin_operation
    async def sink_reroute(
        self,
        name: TopicName,
        query: str,
        partition: Ordinal,
        chunk: Ordinal,
        recorded: dict[str, Any],
        part: dict[str, Any],
        hashes: Any,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        ledger = self._ledger(name, query, partition, chunk)
        moved = await ledger.reroute(recorded_of(recorded), part_of(part), hashes_of(hashes))
        return recorded_document(moved)

    @admin_operation
    async def sink_finish(
        self,
        name: TopicName,
        query: str,
        partition: Ordinal,
        chunk: Ordinal,
        recorded: dict[str, Any],
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        await self._ledger(name, query, partition, chunk).finish(recorded_of(recorded))
        return {"finished": True}

    @admin_operation
    async def forget_write(
        self, name: TopicName, write_id: str, *, credential: str | None = None
    ) -> None:
        """Drop a finished Spark batch write's records (its chunks' ``sink_*`` records)."""
        self._catalog.forget_sink_writes(name, _write_id(write_id))

    def _ledger(self, name: TopicName, query: str, partition: int, chunk: int) -> CatalogLedger:
        internal = SegmentCalls(self._guard.internal_token())
        return CatalogLedger(self._catalog, internal, name, _write_id(query), partition, chunk)


def _write_id(write_id: str) -> str:
    """A write id names one metadata path part: refused unless it is one."""
    return validate_part("write id", write_id)
