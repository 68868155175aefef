"""``NamespaceConsumer``: one subscription on every topic of a namespace whose properties
match a filter, the topics created after it subscribed included (Pulsar's namespace
and pattern subscriptions).

Each matching topic gets a consumer of its own, of the kind asked for (stream or
queue), so every guarantee of that kind holds per topic as it does for one topic: a
stream subscription gets each key's messages in order, within its topic. This class
only finds the topics, hands out what their consumers received (each message says its
``topic``), and gives each acknowledgement to the consumer of the message's topic.

Finding topics: the namespace is listed when the consumer starts and again every
``discovery_interval_s`` while it receives; a topic whose properties hold every
``properties`` item joins. The subscription is created on a topic that lacks it: at
``initial_position`` on the topics there at the start, at ``earliest`` on those that
appear later, so that nothing published to a new topic after the consumer subscribed
is missed. A topic deleted while consumed leaves without failing the others.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any, Literal

from clients._ray import joined
from clients.admin import ScalableTopicsAdmin
from clients.message import Message
from clients.queue_consumer import QueueConsumer
from clients.stream_consumer import StreamConsumer
from runtime.errors import (
    ClientClosedError,
    InvalidArgumentError,
    NotFoundError,
    SubscriptionAlreadyExistsError,
)
from runtime.names import parse_namespace
from runtime.subscription import StartPosition

Kind = Literal["stream", "queue"]
# How long receive() waits between rounds over the topics when none had a message.
_IDLE_S = 0.02


def matches(properties: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Whether a topic with ``properties`` is one the filter ``wanted`` takes: every
    wanted item is among them (an empty filter takes every topic)."""
    return all(properties.get(key) == value for key, value in wanted.items())


class NamespaceConsumer:
    """Consume ``subscription`` on every topic of ``namespace`` (``tenant/namespace``)
    whose properties match ``properties``, as ``consumer_name``."""

    def __init__(
        self,
        namespace: str,
        subscription: str,
        consumer_name: str | None = None,
        *,
        kind: Kind = "stream",
        properties: Mapping[str, str] | None = None,
        initial_position: StartPosition = "latest",
        discovery_interval_s: float = 5.0,
        token: str | None = None,
        address: str | None = None,
    ) -> None:
        """``kind``: ``"stream"`` (each topic's ``StreamConsumer``: ordered, cumulative
        acks; ``consumer_name`` required) or ``"queue"`` (``QueueConsumer``: competing
        consumers, per-message acks). ``token`` needs ``lookup`` and ``consume`` on the
        namespace. The topics matching now are joined here; a refusal is raised here."""
        if kind not in ("stream", "queue"):
            raise InvalidArgumentError(f"kind must be 'stream' or 'queue', got {kind!r}")
        if kind == "stream" and not consumer_name:
            raise InvalidArgumentError("a stream namespace consumer needs a consumer_name")
        if initial_position not in ("earliest", "latest"):
            raise InvalidArgumentError(
                f"initial_position must be 'earliest' or 'latest', got {initial_position!r}"
            )
        if not 0 < discovery_interval_s < float("inf"):
            raise InvalidArgumentError(
                f"discovery_interval_s must be a positive number, got {discovery_interval_s!r}"
            )
        wanted = dict(properties or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in wanted.items()):
            raise InvalidArgumentError("properties must map strings to strings")
        self.namespace = "/".join(parse_namespace(namespace))
        joined(address)
        self.subscription = subscription
        self._name, self._kind, self._wanted = consumer_name, kind, wanted
        self._token, self._interval_s = token, discovery_interval_s
        self._admin = ScalableTopicsAdmin(token=token)
        self._consumers: dict[str, StreamConsumer | QueueConsumer] = {}
        self._others: set[str] = set()  # topics whose properties do not match
        self._turn = 0
        self._closed = False
        self._discover(initial_position)

    @property
    def topics(self) -> list[str]:
        """The topics consumed now."""
        return sorted(self._consumers)

    def discover(self) -> list[str]:
        """List the namespace now (``receive`` does every ``discovery_interval_s``);
        returns the topics that joined."""
        return self._discover("earliest")

    def _discover(self, position: StartPosition) -> list[str]:
        joined_now = []
        for topic in self._admin.list_scalable_topics(self.namespace):
            if topic in self._consumers or topic in self._others:
                continue
            try:
                if not matches(self._admin.get_metadata(topic).get("properties", {}), self._wanted):
                    self._others.add(topic)
                    continue
                self._consumers[topic] = self._join(topic, position)
            except NotFoundError:
                continue  # deleted since the listing
            joined_now.append(topic)
        self._next_discovery = time.monotonic() + self._interval_s
        return joined_now

    def _join(self, topic: str, position: StartPosition) -> StreamConsumer | QueueConsumer:
        with contextlib.suppress(SubscriptionAlreadyExistsError):
            self._admin.create_subscription(topic, self.subscription, position)
        if self._kind == "stream":
            assert self._name is not None
            return StreamConsumer(topic, self.subscription, self._name, token=self._token)
        return QueueConsumer(topic, self.subscription, self._name, token=self._token)

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message of any matching topic (``Message.topic`` says which), or
        ``None`` if none arrives within ``timeout`` seconds. Topics take turns."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise ClientClosedError("consumer is closed")
            if time.monotonic() >= self._next_discovery:
                self._discover("earliest")
            message = self._next()
            if message is not None:
                return message
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(_IDLE_S)

    def _next(self) -> Message | None:
        topics = list(self._consumers)
        for i in range(len(topics)):
            topic = topics[(self._turn + i) % len(topics)]
            try:
                message = self._consumers[topic].receive(timeout=0)
            except NotFoundError:
                self._leave(topic)  # the topic was deleted
                continue
            if message is not None:
                self._turn = (self._turn + i + 1) % len(topics)
                return message
        return None

    def _leave(self, topic: str) -> None:
        consumer = self._consumers.pop(topic)
        with contextlib.suppress(NotFoundError, ClientClosedError):
            consumer.close()

    def acknowledge(self, message: Message) -> None:
        """Acknowledge ``message`` on its topic: cumulatively for a stream consumer (it
        and every earlier message of its segment), alone for a queue consumer."""
        consumer = self._of(message)
        if isinstance(consumer, StreamConsumer):
            consumer.acknowledge_cumulative(message)
        else:
            consumer.acknowledge(message)

    def negative_acknowledge(self, message: Message, error: str | None = None) -> None:
        """Hand a queue consumer's message back for redelivery (``QueueConsumer``)."""
        consumer = self._of(message)
        if not isinstance(consumer, QueueConsumer):
            raise InvalidArgumentError("negative_acknowledge is for queue consumers")
        consumer.negative_acknowledge(message, error)

    def _of(self, message: Message) -> StreamConsumer | QueueConsumer:
        consumer = self._consumers.get(message.topic or "")
        if consumer is None:
            raise InvalidArgumentError(
                f"not a message of a topic this consumer reads: {message.topic!r}"
            )
        return consumer

    def close(self) -> None:
        """Leave every topic's subscription group."""
        self._closed = True
        for topic in list(self._consumers):
            self._leave(topic)

    def __enter__(self) -> NamespaceConsumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
