"""What stream and checkpoint consumers share on the application's side: the public
receive calls, which take from the loop side's inbox (``clients._group_core``) on the
application's thread, and how a consumer reaches its group (a Ray driver's actors, or
the REST gateway).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa

from clients._group_access import GroupAccess
from clients._group_core import GroupConsumerCore
from clients._install import ray_required
from clients._loop import background_loop
from clients.message import Message, messages_from_delivery, table_from_deliveries
from runtime.errors import ClientClosedError, InvalidArgumentError, is_integer
from runtime.names import TopicName, validate_part


def run_on_loop(coro: Any) -> Any:
    return background_loop().run(coro)


def group_access(
    topic: TopicName,
    subscription: str,
    consumer: str,
    credential: str | None,
    *,
    url: str | None,
    address: str | None,
) -> GroupAccess:
    """How a consumer reaches its group: through the gateway at ``url``, else as a Ray
    driver (joining ``address``'s Ray first). Names are checked before either."""
    validate_part("subscription", subscription)
    validate_part("consumer name", consumer)
    if url is not None:
        from clients._remote import RemoteCluster

        return RemoteCluster(url, credential).group_access(topic, subscription)
    with ray_required("a consumer without url= (a Ray driver's)"):
        from clients._ray import RayGroupAccess, joined

    joined(address)
    return RayGroupAccess(topic, subscription, credential)


class GroupConsumer:
    """What stream and checkpoint consumers share on the application side."""

    _core: GroupConsumerCore

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or ``None`` if none arrives within ``timeout`` seconds."""
        taken = self.receive_batch(1, timeout)
        return taken[0] if taken else None

    async def receive_async(self, timeout: float | None = None) -> Message | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.receive, timeout)

    def receive_batch(
        self, max_messages: int = 1_000, timeout: float | None = 1.0
    ) -> list[Message]:
        """Up to ``max_messages``: waits ``timeout`` for the first, then takes what is there."""
        messages: list[Message] = []
        for segment_id, run in self._take(max_messages, timeout):
            messages += messages_from_delivery(segment_id, run, str(self._core.topic))
        return messages

    def receive_table(self, max_messages: int = 10_000, timeout: float | None = 1.0) -> pa.Table:
        """Like ``receive_batch``, as one Arrow table (``RECEIVED_SCHEMA``: segment id,
        key, value, properties, offset, publish time), with no Python object per
        message: the columnar path, as ``Producer.send_batch`` is for sending. Each
        segment's rows are in offset order. An empty table on timeout."""
        return table_from_deliveries(self._take(max_messages, timeout))

    def _take(self, max_messages: int, timeout: float | None) -> list[tuple[int, pa.RecordBatch]]:
        if self._core.closed:
            raise ClientClosedError("consumer is closed")
        if not is_integer(max_messages, 1):
            raise InvalidArgumentError(f"max_messages must be a positive int, got {max_messages!r}")
        return self._core.take(max_messages, timeout)

    def assigned_segments(self) -> list[int]:
        return sorted(self._core.readers)

    def close(self) -> None:
        """Leave the group now (after settling held segments) so others rebalance at once."""
        if not self._core.closed:
            run_on_loop(self._core.close())

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
