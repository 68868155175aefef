"""The admin service's streaming operations, what Spark's streaming source and sink call
through the REST gateway: planning micro-batches (``actors.stream_reads``) and
storing a sink's writes once (``actors.stream_writes``).

A mixin of ``actors.admin_service.AdminService``, which provides ``_allowed`` (the
caller's credential checked against the cluster's policy) and ``_catalog``.
"""

from __future__ import annotations

from typing import Any

from actors.stream_reads import stream_endpoint, stream_initial, stream_latest, stream_ranges
from actors.stream_writes import stream_write
from runtime.auth import Permission
from runtime.names import TopicName
from storage.catalog import Catalog


class StreamOperations:
    _catalog: Catalog

    def _allowed(self, credential: str | None, action: Permission, topic: str) -> TopicName:
        raise NotImplementedError  # AdminService's

    async def stream_initial(
        self,
        topic: str,
        starting: str | dict[str, int] | None = None,
        starting_time_ms: int | None = None,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        name = self._allowed(credential, Permission.CONSUME, topic)
        return await stream_initial(self._catalog, name, starting, starting_time_ms)

    async def stream_latest(
        self,
        topic: str,
        start: dict[str, Any],
        max_messages: int | None = None,
        until: dict[str, Any] | None = None,
        fail_on_data_loss: bool = True,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        name = self._allowed(credential, Permission.CONSUME, topic)
        return await stream_latest(
            self._catalog, name, start, max_messages, until, fail_on_data_loss
        )

    async def stream_ranges(
        self,
        topic: str,
        start: dict[str, Any],
        end: dict[str, Any],
        fail_on_data_loss: bool = True,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        name = self._allowed(credential, Permission.CONSUME, topic)
        return await stream_ranges(self._catalog, name, start, end, fail_on_data_loss)

    async def stream_write(
        self,
        topic: str,
        query: str,
        batch: int,
        partition: int,
        chunk: int,
        records: list[tuple[str | None, bytes, dict[str, str] | None]],
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """One chunk of a streaming sink's micro-batch partition, stored once however often
        it is replayed (``actors.stream_writes``)."""
        name = self._allowed(credential, Permission.PRODUCE, topic)
        return await stream_write(self._catalog, name, query, batch, partition, chunk, records)

    async def stream_endpoint(
        self, topic: str, segment_id: int, *, credential: str | None = None
    ) -> dict[str, Any]:
        name = self._allowed(credential, Permission.CONSUME, topic)
        return await stream_endpoint(self._catalog, name, segment_id)
