"""``QueueConsumer``: shared, unordered consumption with individual acknowledgement.

No coordinator is involved: every queue consumer
attaches to every segment that still has backlog — active and sealed — and
each segment hands different messages to the consumers pulling from it.
New segments arrive through the layout watch; a sealed segment is dropped once
its backlog for the subscription is fully acknowledged. Unacknowledged
messages come back after the segment's ack timeout or a negative ack.

Messages are taken and settled (acknowledged, handed back, a goodbye) over each
segment's data plane (``runtime.wire``), a Ray driver's and a process outside
Ray's alike: two connections per segment, so that acknowledgements never wait
behind a long-poll. What differs is only how the consumer learns the layout and
where a segment listens (``QueueAccess``): a Ray driver asks the cluster's
actors, a process outside Ray the REST gateway (``url=``).

Every connection carries the consumer's credential; a refusal (the token was
revoked) is not retried: the next receive raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from clients._data_plane import REFUSALS, ChannelError, ReadChannel, unreachable
from clients._gc import freeze_what_exists
from clients._inbox import Inbox
from clients._install import ray_required
from clients._loop import background_loop
from clients._remote import gateway_url
from clients.message import Message, messages_from_delivery
from clients.producer import Producer
from clients.transaction import Transaction
from runtime import wire
from runtime.auth import client_credential
from runtime.errors import ClientClosedError, InvalidArgumentError, SegmentNotFoundError
from runtime.layout import SegmentLayout
from runtime.layout_watch import LayoutWatch
from runtime.names import SegmentName, TopicName, validate_part
from runtime.redelivery import DeadLetterPolicy, RedeliveryBackoff, dead_letter_properties

TAKE_WAIT_S = 1.0  # one take's long-poll
FLUSH_EVERY_S = 0.05  # how often acknowledgements go out, batched per segment


@dataclass(frozen=True)
class QueueAccess:
    """How a queue consumer learns its topic's layout and finds its segments."""

    watch: Callable[[], Awaitable[LayoutWatch]]  # raises a refusal of ``consume``
    find: Callable[[SegmentName], Awaitable[Any]]  # ``SegmentNotFoundError`` once gone
    find_again: Callable[[SegmentName], Awaitable[Any | None]]  # after a failed exchange


def queue_access(
    topic: TopicName, credential: str | None, *, url: str | None, address: str | None
) -> QueueAccess:
    """Through the gateway at ``url``, else as a Ray driver (joining ``address``'s Ray)."""
    if url is not None:
        from clients._remote import RemoteCluster

        cluster = RemoteCluster(url, credential)

        async def same(name: SegmentName) -> None:
            return None  # a channel asks the gateway where the segment listens each time

        return QueueAccess(
            lambda: cluster.admitted_watch(topic, wire.CONSUME), cluster.find_segment, same
        )
    with ray_required("a QueueConsumer without url= (a Ray driver's)"):
        from actors.control.dag_watch import DagWatch
        from actors.segment.lookup import find_segment_actor, find_segment_again
        from clients._ray import joined
        from runtime.auth import Permission

    joined(address)
    return QueueAccess(
        lambda: DagWatch.open(topic, credential, Permission.CONSUME),
        lambda name: find_segment_actor(name, credential=credential),
        lambda name: find_segment_again(name, credential=credential),
    )


class _Segment:
    """One segment a consumer pulls from: its two connections."""

    def __init__(self, name: SegmentName, handle: Any, credential: str | None) -> None:
        self.name = name
        self.credential = credential
        self.connect(handle)

    def connect(
        self, handle: Any, relocate: Callable[[], Awaitable[Any | None]] | None = None
    ) -> None:
        """Channels to ``handle``; ``relocate``: looked up again after an exchange failed
        (``ReadChannel``)."""
        self.takes = ReadChannel(handle, credential=self.credential, relocate=relocate)
        self.settles = ReadChannel(handle, credential=self.credential, relocate=relocate)

    def close(self) -> None:
        self.takes.close()
        self.settles.close()


class _QueueCore:
    def __init__(
        self,
        topic: TopicName,
        subscription: str,
        consumer: str,
        receive_batch: int,
        receiver_queue_size: int,
        credential: str | None,
        access: QueueAccess,
    ) -> None:
        self.topic = topic
        self.subscription = validate_part("subscription", subscription)
        self.consumer = consumer
        self.credential = credential
        self.access = access
        self.max_records = receive_batch
        self.queue_size = receiver_queue_size
        self.watch: LayoutWatch | None = None
        self.segments: dict[int, _Segment] = {}  # being pulled from, once found
        self.attached: set[int] = set()
        self.pending_acks: dict[int, list[int]] = defaultdict(list)
        self.messages: Inbox[list[Message]] = Inbox()
        self.tasks: list[asyncio.Task] = []
        self.closed = False
        self.unreachable = (*unreachable(), ChannelError)

    async def start(self) -> None:
        """Raises the refusal of the consumer's credential, before anything else happens."""
        loop = asyncio.get_running_loop()
        self.watch = await self.access.watch()
        self.watch.start()
        self._attach(self.watch.layout)
        self.tasks += [loop.create_task(self._follow()), loop.create_task(self._flush_forever())]
        freeze_what_exists()

    async def close(self) -> None:
        self.closed = True
        for task in self.tasks:
            task.cancel()
        # A flush cancelled mid-exchange put its acknowledgements back: wait for that.
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(*REFUSALS, *self.unreachable):
            await self._flush()
        for segment in list(self.segments.values()):
            goodbye = wire.SettleRequest(
                wire.Settle.CONSUMER_LEFT, self.subscription, self.consumer, []
            )
            with contextlib.suppress(*REFUSALS, *self.unreachable, SegmentNotFoundError):
                await segment.settles.settle(goodbye)
            segment.close()
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
        try:
            segment = _Segment(name, await self.access.find(name), self.credential)
        except SegmentNotFoundError:
            return  # deleted (retention pruned it, or the topic is going): nothing to pull
        except REFUSALS as err:
            self.messages.fail(err)
            return
        self.segments[segment_id] = segment
        take = wire.TakeRequest(self.subscription, self.consumer, self.max_records, TAKE_WAIT_S)
        while not self.closed:
            if len(self.messages) >= self.queue_size:
                await self.messages.wait_for_room(self.queue_size)
                continue
            try:
                batch, drained = await segment.takes.take(take)
            except REFUSALS as err:
                self.messages.fail(err)
                return
            except self.unreachable as err:
                await asyncio.sleep(0.2)  # the segment is restarting, or hibernated
                if not await self._reattach(segment, gone=isinstance(err, SegmentNotFoundError)):
                    break  # deleted (with its topic, or pruned) while pulled from
                continue
            if batch.num_rows:
                self.messages.put(messages_from_delivery(segment_id, batch, str(self.topic)))
            elif drained:
                break
        if self.segments.get(segment_id) is segment:
            del self.segments[segment_id]
            segment.close()

    async def _reattach(self, segment: _Segment, *, gone: bool = False) -> bool:
        """New connections to where the segment's actor is now (after a restart), when
        the way to it changed; False once it is deleted. ``gone``: the last exchange
        said it is not served (deleted, or between hosts), so it is looked up anew,
        waiting for one that is starting. A refusal is raised to the consumer."""
        try:
            if gone:
                handle = await self.access.find(segment.name)
            else:
                handle = await self.access.find_again(segment.name)
        except SegmentNotFoundError:
            return False
        except REFUSALS as err:
            self.messages.fail(err)
            return True
        if handle is not None:
            segment.close()
            segment.connect(handle, lambda: self.access.find_again(segment.name))
        return True

    def record_ack(self, segment_id: int, offset: int) -> None:
        """On the loop thread only, so a flush never swaps the list out from under it."""
        self.pending_acks[segment_id].append(offset)

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            try:
                await self._flush()
            except REFUSALS as err:
                self.messages.fail(err)
                return

    async def _flush(self) -> None:
        """Send each segment's acknowledgements; what no answer confirmed (the segment
        was unreachable, or the flush was cancelled or refused mid-exchange) is kept,
        ahead of any recorded since, for the next flush."""
        for segment_id in list(self.pending_acks):
            offsets = self.pending_acks.pop(segment_id)
            segment = self.segments.get(segment_id)
            if segment is None or not offsets:
                continue
            acks = wire.SettleRequest(wire.Settle.ACK, self.subscription, self.consumer, offsets)
            try:
                await segment.settles.settle(acks)
            except self.unreachable:
                self.pending_acks[segment_id][:0] = offsets
                await self._reattach(segment)
            except BaseException:
                self.pending_acks[segment_id][:0] = offsets
                raise

    async def negative_ack(self, message: Message, delay_s: float) -> None:
        """Hand ``message`` back; a segment that cannot be reached now (restarting) gives
        what it held back by itself, so that is not the caller's error."""
        segment = self.segments.get(message.segment_id)
        if segment is not None:
            request = wire.SettleRequest(
                wire.Settle.NEGATIVE_ACK,
                self.subscription,
                self.consumer,
                [message.offset],
                delay_s,
            )
            with contextlib.suppress(*self.unreachable):
                await segment.settles.settle(request)


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
        url: str | None = None,
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
        is not connected yet. ``url`` (default ``RAYTOPICS_URL`` when no ``address`` is
        given): the REST gateway to learn the layout and find the segments through
        instead, from a process that never joins Ray; messages are taken and settled
        over the segments' data plane either way. Bad arguments are refused before any
        Ray is joined or started."""
        topic_name = TopicName.parse(topic)
        name = consumer_name or f"queue-{uuid.uuid4().hex[:12]}"
        credential = client_credential(token)
        url = gateway_url(url, address)
        validate_part("subscription", subscription)
        access = queue_access(topic_name, credential, url=url, address=address)
        self._dead_letter = dead_letter
        self._backoff = negative_ack_backoff
        self._errors: dict[tuple[int, int], str] = {}  # the last error given per message
        self._dead_letters = (
            Producer(dead_letter.dead_letter_topic, token=token, url=url, address=address)
            if dead_letter
            else None
        )
        self._core = _QueueCore(
            topic_name, subscription, name, receive_batch, receiver_queue_size, credential, access
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

    def acknowledge(self, message: Message, *, txn: Transaction | None = None) -> None:
        """Acknowledge this one message (sent in the background, batched). With ``txn``,
        the acknowledgement applies only when that transaction commits; until it is
        decided the message is held for it (no ack time-out delivers it again; an abort
        does, at once), and ``TransactionConflictError`` says another open transaction
        acknowledged it already."""
        if txn is not None:
            segment = self._core.segments.get(message.segment_id)
            if segment is None:
                raise InvalidArgumentError(
                    f"segment {message.segment_id} is not pulled by this consumer (any more)"
                )
            on_commit = functools.partial(self.acknowledge, message)
            subscription = self._core.subscription
            txn._acknowledge(str(segment.name), subscription, message.offset, False, on_commit)
            return
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
