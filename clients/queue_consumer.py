"""``QueueConsumer``: shared, unordered consumption with individual acknowledgement.

No coordinator is involved: every queue consumer
attaches to every segment that still has backlog — active and sealed — and
each segment hands different messages to the consumers pulling from it.
New segments arrive through the DAG watch; a sealed segment is dropped once
its backlog for the subscription is fully acknowledged. Unacknowledged
messages come back after the segment's ack timeout or a negative ack.

Every call carries the consumer's credential; a refusal (the token was revoked)
is not retried: the next receive raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import defaultdict
from typing import Any

from ray.exceptions import RayActorError

from actors.control.dag_watch import DagWatch
from actors.segment.lookup import find_segment_actor, find_segment_again
from clients._data_plane import REFUSALS
from clients._gc import freeze_what_exists
from clients._inbox import Inbox
from clients._loop import background_loop
from clients._ray import joined
from clients.message import Message, messages_from_delivery
from clients.producer import Producer
from runtime.auth import Permission, client_credential
from runtime.errors import ClientClosedError, SegmentNotFoundError
from runtime.layout import SegmentLayout
from runtime.names import SegmentName, TopicName, validate_part
from runtime.redelivery import DeadLetterPolicy, RedeliveryBackoff, dead_letter_properties
from runtime.remote import call


class _QueueCore:
    def __init__(
        self,
        topic: TopicName,
        subscription: str,
        consumer: str,
        receive_batch: int,
        receiver_queue_size: int,
        credential: str | None,
    ) -> None:
        self.topic = topic
        self.subscription = validate_part("subscription", subscription)
        self.consumer = consumer
        self.credential = credential
        self.max_records = receive_batch
        self.queue_size = receiver_queue_size
        self.watch: DagWatch | None = None
        self.handles: dict[int, Any] = {}  # segments being pulled from, once their actor is found
        self.names: dict[int, SegmentName] = {}
        self.attached: set[int] = set()
        self.pending_acks: dict[int, list[int]] = defaultdict(list)
        self.messages: Inbox[list[Message]] = Inbox()
        self.tasks: list[asyncio.Task] = []
        self.closed = False

    async def start(self) -> None:
        """Raises the refusal of the consumer's credential, before anything else happens."""
        loop = asyncio.get_running_loop()
        self.watch = await DagWatch.open(self.topic, self.credential, Permission.CONSUME)
        self.watch.start()
        self._attach(self.watch.layout)
        self.tasks += [loop.create_task(self._follow()), loop.create_task(self._flush_forever())]
        freeze_what_exists()

    async def close(self) -> None:
        self.closed = True
        for task in self.tasks:
            task.cancel()
        with contextlib.suppress(*REFUSALS):
            await self._flush()
        for handle in self.handles.values():
            with contextlib.suppress(RayActorError, *REFUSALS):
                left = handle.consumer_left.remote(
                    self.subscription, self.consumer, credential=self.credential
                )
                await call(left)
        if self.watch is not None:
            await self.watch.close()

    async def _follow(self) -> None:
        async for layout in self.watch.updates():
            self._attach(layout)

    def _attach(self, layout: SegmentLayout) -> None:
        for segment_id, info in layout.all_segments.items():
            if segment_id in self.attached:
                continue
            self.attached.add(segment_id)
            rng = info.hash_range
            name = self.topic.segment(segment_id, rng.start, rng.end)
            self.tasks.append(asyncio.get_running_loop().create_task(self._pull(segment_id, name)))

    async def _pull(self, segment_id: int, name: SegmentName) -> None:
        self.names[segment_id] = name
        try:
            self.handles[segment_id] = await find_segment_actor(name, credential=self.credential)
        except SegmentNotFoundError:
            return  # deleted (retention pruned it, or the topic is going): nothing to pull
        stale = False
        while not self.closed:
            if len(self.messages) >= self.queue_size:
                await asyncio.sleep(0.005)
                continue
            try:
                if stale:
                    await self._reattach(segment_id)
                    stale = False
                handle = self.handles[segment_id]
                ref = handle.queue_receive.remote(
                    self.subscription,
                    self.consumer,
                    self.max_records,
                    1.0,
                    credential=self.credential,
                )
                batch = await call(ref)
                if batch.num_rows:
                    self.messages.put(messages_from_delivery(segment_id, batch, str(self.topic)))
                    continue
                ref = handle.position.remote(self.subscription, credential=self.credential)
                status = await call(ref)
            except RayActorError:
                await asyncio.sleep(0.2)  # the segment is restarting, or hibernated
                stale = True
                continue
            except REFUSALS as err:
                self.messages.fail(err)
                return
            if status["drained"]:
                del self.handles[segment_id]
                return

    def record_ack(self, segment_id: int, offset: int) -> None:
        """On the loop thread only, so a flush never swaps the list out from under it."""
        self.pending_acks[segment_id].append(offset)

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            try:
                await self._flush()
            except REFUSALS as err:
                self.messages.fail(err)
                return

    async def _reattach(self, segment_id: int) -> None:
        """A new handle when the segment's actor was replaced (``find_segment_again``);
        a refusal is raised."""
        handle = await find_segment_again(self.names[segment_id], credential=self.credential)
        if handle is not None and segment_id in self.handles:  # not drained and dropped
            self.handles[segment_id] = handle

    async def _flush(self) -> None:
        batches, self.pending_acks = self.pending_acks, defaultdict(list)
        for segment_id, offsets in batches.items():
            handle = self.handles.get(segment_id)
            if handle is None or not offsets:
                continue
            ack = handle.ack.remote(self.subscription, offsets, credential=self.credential)
            try:
                await call(ack)
            except RayActorError:  # kept for the next flush, to the segment found again
                self.pending_acks[segment_id][:0] = offsets
                await self._reattach(segment_id)

    async def negative_ack(self, message: Message, delay_s: float) -> None:
        handle = self.handles.get(message.segment_id)
        if handle is not None:
            ref = handle.negative_ack.remote(
                self.subscription,
                [message.offset],
                self.consumer,
                delay_s,
                credential=self.credential,
            )
            await call(ref)


class QueueConsumer:
    """Attach to ``subscription`` as one of any number of competing consumers."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        consumer_name: str | None = None,
        *,
        token: str | None = None,
        dead_letter: DeadLetterPolicy | None = None,
        negative_ack_backoff: RedeliveryBackoff | None = None,
        address: str | None = None,
        receive_batch: int = 500,
        receiver_queue_size: int = 1_000,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) needs ``consume`` on the topic's
        namespace when the cluster has an auth policy; a refusal is raised here.

        ``receive_batch``: the most messages one pull from a segment brings;
        ``receiver_queue_size``: how many received messages wait here for ``receive``.
        ``dead_letter``: a message delivered ``max_deliveries`` times is, on its next
        delivery, published to the policy's topic (which must exist; ``produce`` on it)
        with its origin in its properties, and acknowledged, instead of being returned.
        ``negative_ack_backoff``: how long a negatively acknowledged message is held back
        (by default it comes back at once); ``Message.redelivery_count`` says how often
        a message was delivered before. ``address``: the Ray to join when this process
        is not connected yet."""
        joined(address)
        topic_name = TopicName.parse(topic)
        name = consumer_name or f"queue-{uuid.uuid4().hex[:12]}"
        credential = client_credential(token)
        self._dead_letter = dead_letter
        self._backoff = negative_ack_backoff
        self._errors: dict[tuple[int, int], str] = {}  # the last error given per message
        self._dead_letters = (
            Producer(dead_letter.dead_letter_topic, token=token) if dead_letter else None
        )
        self._core = _QueueCore(
            topic_name, subscription, name, receive_batch, receiver_queue_size, credential
        )
        self._loop = background_loop()
        self._loop.run(self._core.start())

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or ``None`` if none arrives within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._core.closed:
                raise ClientClosedError("consumer is closed")
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            message = self._core.messages.get(left)
            if message is None or not self._is_dead(message):
                return message
            self._bury(message)

    def _is_dead(self, message: Message) -> bool:
        return self._dead_letter is not None and self._dead_letter.is_dead(message.redelivery_count)

    def _bury(self, message: Message) -> None:
        """Publish to the dead-letter topic, then acknowledge: a crash between the two
        leaves it in both (at least once), never in neither."""
        assert self._dead_letter is not None and self._dead_letters is not None
        properties = dead_letter_properties(
            message.properties,
            str(self._core.topic),
            self._core.subscription,
            message.segment_id,
            message.offset,
            message.redelivery_count + 1,
            self._errors.pop((message.segment_id, message.offset), None),
        )
        self._dead_letters.send(message.value, key=message.key, properties=properties).result()
        self.acknowledge(message)

    async def receive_async(self, timeout: float | None = None) -> Message | None:
        return await asyncio.get_running_loop().run_in_executor(None, self.receive, timeout)

    def acknowledge(self, message: Message) -> None:
        """Acknowledge this one message (sent in the background, batched)."""
        self._loop.loop.call_soon_threadsafe(
            self._core.record_ack, message.segment_id, message.offset
        )

    def negative_acknowledge(self, message: Message, error: str | None = None) -> None:
        """Hand the message back for redelivery to any consumer: at once, or after the
        ``negative_ack_backoff`` for its ``redelivery_count``. ``error``: why, carried to
        the dead-letter topic if it ends there."""
        if error is not None:
            self._errors[(message.segment_id, message.offset)] = str(error)
        delay = self._backoff.delay_s(message.redelivery_count) if self._backoff else 0.0
        self._loop.run(self._core.negative_ack(message, delay))

    def close(self) -> None:
        if not self._core.closed:
            self._loop.run(self._core.close())
        if self._dead_letters is not None:
            self._dead_letters.close()

    def __enter__(self) -> QueueConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
