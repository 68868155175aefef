"""The producer's loop side (``clients.producer``): one sender per segment, and the core
that routes queued messages to them and re-routes across splits and merges.

Everything here runs on the producer's private event loop, except the budget and
the intake queue, which user threads touch under their locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from clients._data_plane import ChannelError, SegmentChannel
from clients._limits import ClusterLimits
from clients._loop import background_loop
from clients._send_results import Chunk
from runtime.batch import (
    batch_slices,
    make_batch,
    message_sizes,
    serialize_batch,
)
from runtime.errors import (
    NotEnoughReplicasError,
    NotLeaderError,
    ProducerQueueFullError,
    SegmentTerminated,
    SendTimeoutError,
    TlsError,
)
from runtime.hashing import key_hashes
from runtime.layout import SegmentLayout
from runtime.layout_watch import LayoutWatch
from runtime.names import SegmentName, TopicName
from runtime.routing import partition

if TYPE_CHECKING:
    from clients.producer import ProducerConfig

logger = logging.getLogger(__name__)

_ADOPT_RETRY_S = 0.5
# A replicated segment's answers that a send retries until its deadline, as Kafka's
# producer retries NOT_LEADER and NOT_ENOUGH_REPLICAS: the leader moved (the retry looks
# it up again), or the quorum did not hold the batch in time (the retry is stored once:
# the producer's sequence).
NOT_LEADING = (NotLeaderError, NotEnoughReplicasError)


@dataclass(frozen=True)
class SegmentAccess:
    """How a producer reaches segments where it runs: ``find`` gives what a channel
    connects through (a Ray driver: the segment's actor, ``clients._ray``; a process
    outside Ray: the gateway's answer, ``clients._remote``), waiting for one that is
    starting; ``unavailable`` is what it raises while the segment is not served, which a
    send retries until its deadline."""

    find: Callable[[SegmentName], Awaitable[Any]]
    unavailable: tuple[type[BaseException], ...]


# --- one segment -------------------------------------------------------------------


class SegmentSender:
    """Sends chunks to one segment in sequence order, a window at a time."""

    def __init__(self, core: ProducerCore, layout: SegmentLayout, segment_id: int) -> None:
        info = layout.all_segments[segment_id]
        self.core = core
        self.segment_id = segment_id
        self.name = core.topic.segment(segment_id, info.hash_range.start, info.hash_range.end)
        self.queue: deque[Chunk] = deque()
        self.in_flight: dict[int, Chunk] = {}
        # Resends go out in sequence order (``_await_turn``): the generation moves on at
        # each failure of a send of the current one, and a sequence is written only once
        # every earlier one in flight was written in the current generation.
        self.generation = 0
        self.written: dict[int, int] = {}  # sequence -> the generation it was written in
        self.turn_waiters: list[asyncio.Future] = []
        self.refused: list[tuple[int, Chunk]] = []
        self.next_sequence = 0
        self.handle: Any = None
        self.lookup: asyncio.Task | None = None
        self.channel: SegmentChannel | None = None
        self.retiring = False
        self.settled = asyncio.Event()

    def enqueue(self, chunk: Chunk) -> None:
        """Queue only: the router pumps once it has queued everything it gathered,
        so chunks that meet in this queue go as one append (Kafka's accumulator)."""
        self.queue.append(chunk)

    def pump(self) -> None:
        if self.handle is None:  # sends start once the actor is known, in sequence order
            self._look_up_once()
            return
        while not self.retiring and self.queue and len(self.in_flight) < self.core.config.window:
            chunk, sequence = self._next_append(), self.next_sequence
            self.next_sequence += 1
            self.in_flight[sequence] = chunk
            asyncio.get_running_loop().create_task(self._send(sequence, chunk))

    def _next_append(self) -> Chunk:
        """The queue's head joined with the chunks behind it, within the batch limits.

        Not for a producer given its id: it resends under the same id and sequences
        after a restart (a retried Spark task), so each sequence must carry the same
        rows every time, and what meets in a queue depends on timing."""
        taken = [self.queue.popleft()]
        if self.core.config.producer_id is not None:
            return taken[0]
        rows, size = taken[0].batch.num_rows, taken[0].message_bytes
        max_messages, max_bytes = self.core.batch_limits()
        while self.queue and (
            self.queue[0].txn == taken[0].txn
            and rows + self.queue[0].batch.num_rows <= max_messages
            and size + self.queue[0].message_bytes <= max_bytes
        ):
            taken.append(self.queue.popleft())
            rows, size = rows + taken[-1].batch.num_rows, size + taken[-1].message_bytes
        return taken[0] if len(taken) == 1 else Chunk.joined(taken)

    async def _send(self, sequence: int, chunk: Chunk) -> None:
        deadline = time.monotonic() + self.core.config.send_timeout_s
        while True:
            try:
                base = await self._append(sequence, chunk, deadline)
                chunk.resolve(self.segment_id, base)
                self.core.release(chunk)
            except SegmentTerminated:
                self.refused.append((sequence, chunk))
                self.core.segment_sealed(self)
            except TlsError as err:  # not a segment that is away: no retry reaches it
                self._fail(chunk, err)
            except (*self.core.access.unavailable, *NOT_LEADING) as err:
                self.handle = None
                if self.written.get(sequence) == self.generation:
                    self.generation += 1  # every send in flight now goes again, in order
                if time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    continue
                self._fail(chunk, SendTimeoutError(f"{self.name} unavailable: {err}"))
            except (TimeoutError, ChannelError) as err:
                why = f" ({err})" if str(err) else ""
                timeout_s = self.core.config.send_timeout_s
                self._fail(chunk, SendTimeoutError(
                    f"{self.name}: not stored within the send time-out of {timeout_s:g}s{why}"
                ))  # fmt: skip
            except Exception as err:  # noqa: BLE001 - the caller's future must learn it
                self._fail(chunk, err)
            break
        del self.in_flight[sequence]
        self.written.pop(sequence, None)
        self._wake_turns()
        if not self.in_flight:
            self.settled.set()
        self.pump()

    async def _append(self, sequence: int, chunk: Chunk, deadline: float) -> int:
        """One append over the configured transport; returns the base offset."""
        while True:
            self.handle = self.handle or await self.core.access.find(self.name)  # after a failure
            await self._await_turn(sequence, deadline)
            if self.handle is not None:  # not lost again meanwhile
                break
        self.written[sequence] = self.generation  # from here to the write, nothing awaits
        self._wake_turns()
        producer_id = self.core.producer_id
        if self.core.config.transport == "ray":
            from runtime.remote import call  # a Ray driver's only

            joins = {"txn_id": chunk.txn} if chunk.txn is not None else {}
            ref = self.handle.append.remote(
                chunk.batch, producer_id, sequence, credential=self.core.credential, **joins
            )
            base, _ = await call(ref)
            return base
        channel = self._open_channel()
        payload = serialize_batch(chunk.batch, self.core.config.compression)
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):  # no task
            base, _ = await channel.append(producer_id, sequence, payload, chunk.txn)
        return base

    async def _await_turn(self, sequence: int, deadline: float) -> None:
        """Until every earlier sequence in flight was written in the current generation.
        A connection's frames are stored in the order written, and a frame that overtook
        its predecessor waits for it in front of it: resent each on its own after a
        failure, a later sequence could be written first and hold its connection until
        the segment gives up on the missing one (``OutOfOrderSequenceError``)."""
        while not self._may_write(sequence):
            waiter = asyncio.get_running_loop().create_future()
            self.turn_waiters.append(waiter)
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                await waiter

    def _may_write(self, sequence: int) -> bool:
        return all(
            self.written.get(earlier) == self.generation
            for earlier in self.in_flight
            if earlier < sequence
        )

    def _wake_turns(self) -> None:
        waiters, self.turn_waiters = self.turn_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _look_up_once(self) -> None:
        if self.lookup is None or self.lookup.done():
            self.lookup = asyncio.get_running_loop().create_task(self._look_up())

    async def _look_up(self) -> None:
        """Find the segment's actor before any send starts: a split's children register
        theirs just after the layout names them. Sends that each looked up on their
        own could overtake one another on the data plane, and a frame that overtook
        its predecessor waits for it, parked in front of it."""
        try:
            self.handle = await self.core.access.find(self.name)
        except Exception as err:  # noqa: BLE001 - queued sends must fail, never hang
            queued, self.queue = list(self.queue), deque()
            for chunk in queued:
                self._fail(chunk, SendTimeoutError(f"{self.name} unavailable: {err!r}"))
            return
        if self.core.config.transport == "tcp":
            self._open_channel()  # ahead of the first send
        self.pump()

    def _open_channel(self) -> SegmentChannel:
        if self.channel is None:
            self.channel = SegmentChannel(
                self.handle, credential=self.core.credential, relocate=self._find
            )
        self.channel.open()
        return self.channel

    async def _find(self) -> Any:
        """The segment's actor looked up afresh, for a channel's next connection: a
        replicated segment's leader may have moved to another node."""
        self.handle = await self.core.access.find(self.name)
        return self.handle

    def _fail(self, chunk: Chunk, error: BaseException) -> None:
        chunk.fail(error)
        self.core.release(chunk)

    def take_backlog(self) -> list[Chunk]:
        """Refused chunks (in sequence order) then queued ones: what must be re-routed."""
        backlog = [chunk for _, chunk in sorted(self.refused, key=lambda item: item[0])]
        backlog.extend(self.queue)
        self.refused.clear()
        self.queue.clear()
        return backlog

    async def until_settled(self) -> None:
        while self.in_flight:
            self.settled.clear()
            await self.settled.wait()


# --- the producer's loop side -----------------------------------------------------------


class ProducerCore:
    def __init__(
        self,
        topic: TopicName,
        config: ProducerConfig,
        watch: LayoutWatch,
        limits: ClusterLimits,
        credential: str | None,
        access: SegmentAccess,
    ) -> None:
        self.topic = topic
        self.access = access
        self.config = config
        self.credential = credential
        self.producer_id = config.producer_id or uuid.uuid4().hex
        self.watch = watch
        self.layout = self.watch.layout
        self.limits = limits
        self.senders: dict[int, SegmentSender] = {}
        self.routing_open = asyncio.Event()
        self.routing_open.set()
        self.incoming: deque[tuple] = deque()
        self.incoming_rows = 0  # messages in ``incoming``, under ``intake``
        self.intake = threading.Lock()
        self.wakeup = asyncio.Event()
        self.signaled = False
        self.round_robin = 0
        self.budget = threading.Condition()
        self.outstanding_bytes = 0
        self.layout_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.watch.start()
        self.tasks = [loop.create_task(self._pump()), loop.create_task(self._follow_layouts())]
        self._add_senders()
        self._pump_senders()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sender in self.senders.values():
            if sender.channel is not None:
                await sender.channel.close()
        await self.watch.close()

    # budget (called from user threads and the loop)

    def charge(self, nbytes: int) -> None:
        with self.budget:
            while self.outstanding_bytes + nbytes > self.config.max_in_flight_bytes:
                if not self.config.block_if_full and self.outstanding_bytes:
                    raise ProducerQueueFullError(
                        f"{self.outstanding_bytes} bytes in flight, limit "
                        f"{self.config.max_in_flight_bytes}: retry later or flush()"
                    )
                if not self.outstanding_bytes:
                    break  # one oversized message may always go alone
                self.budget.wait()
            self.outstanding_bytes += nbytes

    def release(self, chunk: Chunk) -> None:
        with self.budget:
            self.outstanding_bytes -= chunk.nbytes
            self.budget.notify_all()

    # intake

    def submit(self, item: tuple, rows: int) -> None:
        """Called from any thread."""
        with self.intake:
            self.incoming.append(item)
            self.incoming_rows += rows
        if not self.signaled:
            self.signaled = True
            background_loop().loop.call_soon_threadsafe(self.wakeup.set)

    async def _pump(self) -> None:
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            if self.incoming_rows < self.config.batch_max_records and self.config.linger_ms > 0:
                await asyncio.sleep(self.config.linger_ms / 1000)
            self.signaled = False
            await self.routing_open.wait()
            self._route_incoming()

    def _route_incoming(self) -> None:
        with self.intake:
            items, self.incoming, self.incoming_rows = self.incoming, deque(), 0
        singles: list[tuple] = []
        for item in items:
            if item[0] == "one" and (not singles or singles[-1][-1] == item[-1]):
                singles.append(item)  # messages of one transaction (or of none) in a row
                continue
            self._route_singles(singles)
            singles = []
            if item[0] == "one":
                singles.append(item)
                continue
            _, batch, sink, txn = item
            rows = batch.num_rows
            sinks = np.full(rows, sink, dtype=object)
            self._route(Chunk(batch, sinks, np.arange(rows), True, txn))
        self._route_singles(singles)
        self._pump_senders()

    def _route_singles(self, items: list[tuple]) -> None:
        if not items:
            return
        _, values, keys, props, sinks, txns = zip(*items, strict=True)
        batch = make_batch(list(values), list(keys), list(props) if any(props) else None)
        sink_array = np.empty(len(sinks), dtype=object)
        sink_array[:] = sinks
        positions = np.zeros(len(sinks), dtype=np.int64)
        self._route(Chunk(batch, sink_array, positions, txn=txns[0]))

    def _route(self, chunk: Chunk) -> None:
        active = list(self.layout.active_segments)
        self.round_robin = (self.round_robin + 1) % len(active)
        hashes = key_hashes(chunk.batch.column("key"))
        groups = partition(self.layout, hashes, active[self.round_robin]).groups
        if len(groups) > 1:  # one copy, grouped by segment; each segment gets slices of it
            chunk = chunk.take(np.concatenate(list(groups.values())))
        first = 0
        for segment_id, rows in groups.items():
            sender, end = self._sender(segment_id), first + len(rows)
            for start, stop in self._cuts(chunk, first, end):
                sender.enqueue(chunk.slice(start, stop - start))
            first = end

    def _cuts(self, chunk: Chunk, first: int, end: int) -> list[tuple[int, int]]:
        """Rows ``[first, end)`` of ``chunk`` in runs that one append may carry."""
        max_messages, max_bytes = self.batch_limits()
        if chunk.batch.num_rows <= max_messages and chunk.message_bytes <= max_bytes:
            return [(first, end)]  # the whole chunk fits: no sizes to add up
        sizes = message_sizes(chunk.batch.slice(first, end - first))
        return [(first + a, first + b) for a, b in batch_slices(sizes, max_messages, max_bytes)]

    def batch_limits(self) -> tuple[int, int]:
        """Most messages and bytes one append may carry."""
        limits = self.limits.current
        return min(self.config.batch_max_records, limits.max_batch_messages), limits.max_batch_bytes

    def _add_senders(self) -> None:
        """A sender for every active segment of the layout just adopted, so each looks
        its actor up and connects when next pumped, before its first send (Pulsar's
        partitioned producer connects to every partition up front): a cold first send
        waited ~50 ms for both."""
        for segment_id in self.layout.active_segments:
            self._sender(segment_id)

    def _pump_senders(self) -> None:
        for sender in list(self.senders.values()):
            sender.pump()

    def _sender(self, segment_id: int) -> SegmentSender:
        sender = self.senders.get(segment_id)
        if sender is None:
            sender = self.senders[segment_id] = SegmentSender(self, self.layout, segment_id)
        return sender

    # layout changes

    def segment_sealed(self, sender: SegmentSender) -> None:
        """A segment refused an append: the layout moved on; learn it now."""
        asyncio.get_running_loop().create_task(self._learn_successor(sender))

    async def _learn_successor(self, sender: SegmentSender) -> None:
        try:
            layout = await self.watch.refresh()
        except Exception as err:  # noqa: BLE001 - refused (revoked): what waits must fail
            for chunk in sender.take_backlog():
                sender._fail(chunk, err)
            return
        if sender.segment_id in layout.active_segments:
            await self._await_successor(sender)

    async def _await_successor(self, sender: SegmentSender) -> None:
        try:
            await self.watch.wait_newer(self.layout.epoch, timeout_s=self.config.send_timeout_s)
        except TimeoutError:
            error = SegmentTerminated(
                f"{sender.name} is terminated and no layout replaced it within "
                f"{self.config.send_timeout_s}s",
                sender.segment_id,
            )
            for chunk in sender.take_backlog():
                sender._fail(chunk, error)

    async def _follow_layouts(self) -> None:
        async for layout in self.watch.updates():
            while True:  # sends refused by a sealed segment wait for this adoption
                try:
                    await self._adopt(layout)
                    break
                except Exception:
                    logger.exception("producer for %s: adopting epoch %d", self.topic, layout.epoch)
                    await asyncio.sleep(_ADOPT_RETRY_S)

    async def _adopt(self, layout: SegmentLayout) -> None:
        """Re-route retired segments' backlogs; sends wait while this runs, and
        resume even if it fails (``finally``): a closed gate would hang them all."""
        async with self.layout_lock:
            if layout.epoch <= self.layout.epoch:
                return
            retiring = [s for sid, s in self.senders.items() if sid not in layout.active_segments]
            self.routing_open.clear()
            try:
                await self._retire(retiring, layout)
            finally:
                self.routing_open.set()

    async def _retire(self, retiring: list[SegmentSender], layout: SegmentLayout) -> None:
        for sender in retiring:
            sender.retiring = True
        await asyncio.gather(*(s.until_settled() for s in retiring))
        backlog = [chunk for sender in retiring for chunk in sender.take_backlog()]
        for sender in retiring:
            del self.senders[sender.segment_id]
        self.layout = layout
        self._add_senders()
        for chunk in backlog:
            self._route(chunk)
        self._pump_senders()
        for sender in retiring:
            if sender.channel is not None:
                await sender.channel.close()
