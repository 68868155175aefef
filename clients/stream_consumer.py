"""``StreamConsumer``: ordered consumption with cumulative acknowledgement.

Each segment of the topic is read by exactly one consumer of the subscription
at a time, in offset order, and a child segment only after all its parents are
finished — so every key's messages arrive in the order they were produced.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from clients._group_consumer import GroupConsumer, group_access, run_on_loop
from clients._group_core import ConsumerConfig, GroupConsumerCore
from clients._remote import gateway_url
from clients.message import Message, highest_offsets
from clients.transaction import Transaction
from runtime.auth import client_credential
from runtime.errors import InvalidArgumentError
from runtime.names import TopicName

_POSITION = operator.attrgetter("segment_id", "offset")


class StreamConsumer(GroupConsumer):
    """Join ``subscription`` as ``consumer_name``; a restart with the same name within the
    subscription's grace period resumes the same segments without disturbing others."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        consumer_name: str,
        *,
        token: str | None = None,
        address: str | None = None,
        url: str | None = None,
        **config: Any,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume`` on the topic's
        namespace when the cluster has an auth policy; a refusal is raised here.
        ``address``: the Ray to join when this process is not connected yet. ``url``
        (default ``RAYTOPICS_URL`` when no ``address`` is given): the REST gateway to
        consume through instead, from a process that never joins Ray; the records still
        come over the segments' data plane. Bad arguments are refused before any Ray is
        joined or started."""
        name, settings = TopicName.parse(topic), ConsumerConfig(**config)
        credential = client_credential(token)
        url = gateway_url(url, address)
        access = group_access(
            name, subscription, consumer_name, credential, url=url, address=address
        )
        self._core = GroupConsumerCore(
            name,
            subscription,
            consumer_name,
            acknowledges=True,
            config=settings,
            credential=credential,
            access=access,
        )
        run_on_loop(self._core.start())

    def acknowledge_cumulative(
        self,
        messages: Message | Iterable[Message] | pa.Table | pa.RecordBatch,
        *,
        txn: Transaction | None = None,
    ) -> None:
        """Acknowledge a message and every earlier message of its segment, or, given a
        batch (what ``receive_batch`` or ``receive_table`` returned), each segment's
        messages up to its highest offset in the batch. Acks are per segment, as Kafka
        commits per partition: acking only ``batch[-1]`` would leave the other
        segments' messages unacknowledged.

        With ``txn``, the acknowledgements apply only when that transaction commits
        (consume-transform-produce: what was read and what was written in reaction
        commit together)."""
        if isinstance(messages, pa.Table | pa.RecordBatch):
            highest = highest_offsets(messages)
        else:
            highest = _highest_of_messages(messages)
        for segment_id, offset in highest.items():
            if txn is None:
                self._core.acknowledge(segment_id, offset)
                continue
            reader = self._core.readers.get(segment_id)
            if reader is None:
                raise InvalidArgumentError(
                    f"segment {segment_id} is not read by this consumer (any more): its "
                    "messages are redelivered to the one that reads it now"
                )
            on_commit = functools.partial(self._core.acknowledge, segment_id, offset)
            txn._acknowledge(str(reader.name), self._core.group, offset, True, on_commit)


def _highest_of_messages(messages: Message | Iterable[Message]) -> dict[int, int]:
    messages = [messages] if isinstance(messages, Message) else list(messages)
    for kind in set(map(type, messages)):  # no Python loop per message: batches are big
        if not issubclass(kind, Message):
            raise InvalidArgumentError(
                "acknowledge_cumulative takes a received Message, an iterable of them or a "
                f"table from receive_table, got {kind.__name__}"
            )
    # Sorted, each segment's highest offset comes last and so is the one kept.
    return dict(sorted(map(_POSITION, messages)))
