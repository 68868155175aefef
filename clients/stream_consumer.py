"""``StreamConsumer``: ordered consumption with cumulative acknowledgement.

Each segment of the topic is read by exactly one consumer of the subscription
at a time, in offset order, and a child segment only after all its parents are
finished — so every key's messages arrive in the order they were produced.
"""

from __future__ import annotations

from typing import Any

from clients._group_consumer import (
    ConsumerConfig,
    GroupConsumer,
    GroupConsumerCore,
    run_on_loop,
)
from clients.message import Message
from runtime.auth import Permission, authorize_client
from runtime.names import TopicName


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
        **config: Any,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume`` when auth is on."""
        name = TopicName.parse(topic)
        authorize_client(token, Permission.CONSUME, name)
        self._core = GroupConsumerCore(
            name,
            subscription,
            consumer_name,
            acknowledges=True,
            config=ConsumerConfig(**config),
        )
        run_on_loop(self._core.start())

    def acknowledge_cumulative(self, message: Message) -> None:
        """Acknowledge ``message`` and every earlier message of its segment."""
        self._core.acknowledge(message.segment_id, message.offset)
