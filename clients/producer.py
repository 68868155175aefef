"""``Producer``: batching, key routing and re-routing across splits and merges.

Messages are routed by key hash to the active segment covering it (unkeyed
ones round-robin per batch), grouped into Arrow batches per segment and sent
with a per-segment sequence number, several batches in flight at once. The
segment stores a producer's batches in sequence order and drops resent ones,
so retries never duplicate.

When a layout change seals segments this producer writes to, routing pauses
until every sealed segment's in-flight batches have settled; the batches it
refused, then those still queued, are re-routed in order to the children, and
only then do new messages flow. So nothing for a key reaches a child before
everything for that key in the parent is acknowledged.

All of it runs on one private event loop; the public methods are thread-safe.

The producer's credential goes with every call and every data-plane
connection, and is checked by the cluster, never here: a producer starts by
asking the DAG watch for the layout *to produce*, so a token that may not
produce is refused at construction; a revoked one fails the sends in flight
and every later one with the refusal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread  # noqa: F401 - its exit hook first, see below
import contextlib
import dataclasses
import functools
import logging
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from actors.dag_watch import DagWatch
from actors.segment import find_segment_actor
from clients._data_plane import ChannelError, SegmentChannel
from clients._ray import background_loop, freeze_what_exists, joined
from clients.message import BatchResult, MessageId
from runtime.auth import Permission, client_credential
from runtime.batch import (
    batch_bytes,
    check_compression,
    equal_runs,
    make_batch,
    message_sizes,
    serialize_batch,
)
from runtime.errors import (
    ClientClosedError,
    InvalidArgumentError,
    ProducerQueueFullError,
    SegmentNotFoundError,
    SegmentTerminated,
    SendTimeoutError,
    UnseenSendFailuresError,
)
from runtime.hashing import key_hashes
from runtime.layout import SegmentLayout
from runtime.limits import LiveLimits, batch_slices
from runtime.names import TopicName
from runtime.remote import call
from runtime.routing import partition
from storage.catalog import Catalog

logger = logging.getLogger(__name__)

_ADOPT_RETRY_S = 0.5
_ROW_OVERHEAD = 64  # bytes charged per message on top of key and value
# Producers still open when the program ends are closed then, as leaving a ``with``
# block does: a script that never closes its producer loses no send it made. Kept
# here (not weakly) because ``Producer(topic).send(...)`` drops its only reference.
_OPEN: set[Producer] = set()
_OPEN_LOCK = threading.Lock()
_AT_EXIT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ProducerConfig:
    batch_max_records: int = 5_000
    linger_ms: float = 2.0
    max_in_flight_bytes: int = 64 << 20
    block_if_full: bool = True
    send_timeout_s: float = 60.0
    window: int = 16  # appends in flight per segment
    transport: Literal["tcp", "ray"] = "tcp"  # tcp: the segment's data plane (runtime.wire)
    # Segments drop a producer's resent (id, sequence): a writer that must be idempotent
    # across process restarts (a retried Spark task) reuses its id and its sequences.
    producer_id: str | None = None
    # Arrow IPC body compression of each append ("zstd", "lz4"): stored as sent, so it
    # shrinks the segments' disks too; readers get the records decoded.
    compression: str | None = None

    def __post_init__(self) -> None:
        if self.transport not in ("tcp", "ray"):
            raise InvalidArgumentError(f"transport must be 'tcp' or 'ray', got {self.transport!r}")
        check_compression(self.compression)
        if self.compression is not None and self.transport == "ray":
            raise InvalidArgumentError(
                "compression travels with the data plane transport ('tcp'); a 'ray' "
                "transport append is a RecordBatch the segment encodes itself"
            )
        if self.batch_max_records < 1 or self.max_in_flight_bytes < 1 or self.window < 1:
            raise InvalidArgumentError(
                "batch_max_records, max_in_flight_bytes and window must be positive"
            )


# --- where results go -------------------------------------------------------------


class SendFuture(concurrent.futures.Future):
    """A send's future that remembers whether its caller looked at the outcome
    (``result``, ``exception`` or a done-callback, which ``send_async`` uses): a
    failure nobody looked at is raised by the producer's ``close()`` instead of
    vanishing. The producer's own bookkeeping goes through ``_watch``, unseen."""

    def __init__(self) -> None:
        super().__init__()
        self.observed = False

    def result(self, timeout: float | None = None) -> Any:
        self.observed = True
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.observed = True
        return super().exception(timeout)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future], object]) -> None:
        self.observed = True
        super().add_done_callback(fn)

    def _watch(self, fn: Callable[[SendFuture], object]) -> None:
        super().add_done_callback(fn)  # type: ignore[arg-type]

    def _failure(self) -> BaseException | None:
        """The failure of a done future, without counting as looked at."""
        return super().exception(0)


class _MessageSink:
    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future = SendFuture()

    def fill(self, positions: np.ndarray, segment_id: int, offsets: np.ndarray) -> None:
        if not self.future.done():
            self.future.set_result(MessageId(segment_id, int(offsets[0])))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class _BulkSink:
    __slots__ = ("future", "segment_ids", "offsets", "remaining")

    def __init__(self, rows: int) -> None:
        self.future = SendFuture()
        self.segment_ids = np.full(rows, -1, dtype=np.int64)
        self.offsets = np.full(rows, -1, dtype=np.int64)
        self.remaining = rows

    def fill(self, positions: np.ndarray, segment_id: int, offsets: np.ndarray) -> None:
        self.segment_ids[positions] = segment_id
        self.offsets[positions] = offsets
        self.remaining -= len(positions)
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(BatchResult(self.segment_ids, self.offsets))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


_Sink = _MessageSink | _BulkSink


@dataclass
class _Chunk:
    """Rows bound for one segment, and which sink/position each row reports to."""

    batch: pa.RecordBatch
    sinks: np.ndarray  # object array, one sink per row
    positions: np.ndarray
    uniform: bool = False  # every row reports to the same (bulk) sink

    @functools.cached_property
    def message_bytes(self) -> int:
        return batch_bytes(self.batch)

    @property
    def nbytes(self) -> int:
        return _charge(self.batch)

    def resolve(self, segment_id: int, base_offset: int) -> None:
        """Each run of rows reporting to the same sink fills it in one call."""
        offsets = np.arange(base_offset, base_offset + self.batch.num_rows, dtype=np.int64)
        if self.uniform:
            self.sinks[0].fill(self.positions, segment_id, offsets)
            return
        for start, end in equal_runs(self.sinks):
            self.sinks[start].fill(self.positions[start:end], segment_id, offsets[start:end])

    def fail(self, error: BaseException) -> None:
        for sink in {id(s): s for s in self.sinks}.values():
            sink.fail(error)

    def take(self, rows: np.ndarray) -> _Chunk:
        taken = self.batch.take(pa.array(rows))
        return _Chunk(taken, self.sinks[rows], self.positions[rows], self.uniform)

    @staticmethod
    def joined(chunks: list[_Chunk]) -> _Chunk:
        """One append instead of several: their rows, in order, copied once."""
        first = chunks[0].sinks[0]
        uniform = all(c.uniform and c.sinks[0] is first for c in chunks)
        return _Chunk(
            pa.concat_batches([c.batch for c in chunks]),
            np.concatenate([c.sinks for c in chunks]),
            np.concatenate([c.positions for c in chunks]),
            uniform,
        )

    def slice(self, start: int, length: int) -> _Chunk:
        """Rows ``start`` to ``start + length``, without copying them."""
        end = start + length
        sliced = self.batch.slice(start, length)
        return _Chunk(sliced, self.sinks[start:end], self.positions[start:end], self.uniform)


def _charge(batch: pa.RecordBatch) -> int:
    """Bytes a batch holds against the in-flight budget (same rule as at submit).

    Additive over any split of the rows, so the chunks of a batch release
    exactly what the batch was charged; O(1), from the offsets of the columns.
    """
    return batch_bytes(batch) + _ROW_OVERHEAD * batch.num_rows


# --- one segment -------------------------------------------------------------------


class _SegmentSender:
    """Sends chunks to one segment in sequence order, a window at a time."""

    def __init__(self, core: _ProducerCore, layout: SegmentLayout, segment_id: int) -> None:
        info = layout.all_segments[segment_id]
        self.core = core
        self.segment_id = segment_id
        self.name = core.topic.segment(segment_id, info.hash_range.start, info.hash_range.end)
        self.queue: deque[_Chunk] = deque()
        self.in_flight: dict[int, _Chunk] = {}
        self.refused: list[tuple[int, _Chunk]] = []
        self.next_sequence = 0
        self.handle: Any = None
        self.lookup: asyncio.Task | None = None
        self.channel: SegmentChannel | None = None
        self.retiring = False
        self.settled = asyncio.Event()

    def enqueue(self, chunk: _Chunk) -> None:
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

    def _next_append(self) -> _Chunk:
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
            rows + self.queue[0].batch.num_rows <= max_messages
            and size + self.queue[0].message_bytes <= max_bytes
        ):
            taken.append(self.queue.popleft())
            rows, size = rows + taken[-1].batch.num_rows, size + taken[-1].message_bytes
        return taken[0] if len(taken) == 1 else _Chunk.joined(taken)

    async def _send(self, sequence: int, chunk: _Chunk) -> None:
        deadline = time.monotonic() + self.core.config.send_timeout_s
        while True:
            try:
                base = await self._append(sequence, chunk, deadline)
                chunk.resolve(self.segment_id, base)
                self.core.release(chunk)
            except SegmentTerminated:
                self.refused.append((sequence, chunk))
                self.core.segment_sealed(self)
            except (
                SegmentNotFoundError,
                ActorUnavailableError,
                ActorDiedError,
                RayActorError,
            ) as err:
                self.handle = None
                if time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    continue
                self._fail(chunk, SendTimeoutError(f"{self.name} unavailable: {err}"))
            except (TimeoutError, ChannelError) as err:
                self._fail(chunk, SendTimeoutError(f"{self.name}: not stored in time ({err})"))
            except Exception as err:  # noqa: BLE001 - the caller's future must learn it
                self._fail(chunk, err)
            break
        del self.in_flight[sequence]
        if not self.in_flight:
            self.settled.set()
        self.pump()

    async def _append(self, sequence: int, chunk: _Chunk, deadline: float) -> int:
        """One append over the configured transport; returns the base offset."""
        self.handle = self.handle or await find_segment_actor(
            self.name, credential=self.core.credential
        )  # after a failure
        producer_id = self.core.producer_id
        if self.core.config.transport == "ray":
            ref = self.handle.append.remote(
                chunk.batch, producer_id, sequence, credential=self.core.credential
            )
            base, _ = await call(ref)
            return base
        channel = self._open_channel()
        payload = serialize_batch(chunk.batch, self.core.config.compression)
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):  # no task
            base, _ = await channel.append(producer_id, sequence, payload)
        return base

    def _look_up_once(self) -> None:
        if self.lookup is None or self.lookup.done():
            self.lookup = asyncio.get_running_loop().create_task(self._look_up())

    async def _look_up(self) -> None:
        """Find the segment's actor before any send starts: a split's children register
        theirs just after the layout names them. Sends that each looked up on their
        own could overtake one another on the data plane, and a frame that overtook
        its predecessor waits for it, parked in front of it."""
        try:
            self.handle = await find_segment_actor(self.name, credential=self.core.credential)
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
            self.channel = SegmentChannel(self.handle, credential=self.core.credential)
        self.channel.open()
        return self.channel

    def _fail(self, chunk: _Chunk, error: BaseException) -> None:
        chunk.fail(error)
        self.core.release(chunk)

    def take_backlog(self) -> list[_Chunk]:
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


class _ProducerCore:
    def __init__(
        self, topic: TopicName, config: ProducerConfig, watch: DagWatch, credential: str | None
    ) -> None:
        self.topic = topic
        self.config = config
        self.credential = credential
        self.producer_id = config.producer_id or uuid.uuid4().hex
        self.watch = watch
        self.layout = self.watch.layout
        namespace = f"{topic.tenant}/{topic.namespace}"
        self.limits = LiveLimits(Catalog(), namespace)
        self.senders: dict[int, _SegmentSender] = {}
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

    def release(self, chunk: _Chunk) -> None:
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
            if item[0] == "one":
                singles.append(item)
                continue
            self._route_singles(singles)
            singles = []
            _, batch, sink = item
            rows = batch.num_rows
            self._route(_Chunk(batch, np.full(rows, sink, dtype=object), np.arange(rows), True))
        self._route_singles(singles)
        self._pump_senders()

    def _route_singles(self, items: list[tuple]) -> None:
        if not items:
            return
        _, values, keys, props, sinks = zip(*items, strict=True)
        batch = make_batch(list(values), list(keys), list(props) if any(props) else None)
        sink_array = np.empty(len(sinks), dtype=object)
        sink_array[:] = sinks
        self._route(_Chunk(batch, sink_array, np.zeros(len(sinks), dtype=np.int64)))

    def _route(self, chunk: _Chunk) -> None:
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

    def _cuts(self, chunk: _Chunk, first: int, end: int) -> list[tuple[int, int]]:
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

    def _sender(self, segment_id: int) -> _SegmentSender:
        sender = self.senders.get(segment_id)
        if sender is None:
            sender = self.senders[segment_id] = _SegmentSender(self, self.layout, segment_id)
        return sender

    # layout changes

    def segment_sealed(self, sender: _SegmentSender) -> None:
        """A segment refused an append: the layout moved on; learn it now."""
        asyncio.get_running_loop().create_task(self._learn_successor(sender))

    async def _learn_successor(self, sender: _SegmentSender) -> None:
        try:
            layout = await self.watch.refresh()
        except Exception as err:  # noqa: BLE001 - refused (revoked): what waits must fail
            for chunk in sender.take_backlog():
                sender._fail(chunk, err)
            return
        if sender.segment_id in layout.active_segments:
            await self._await_successor(sender)

    async def _await_successor(self, sender: _SegmentSender) -> None:
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

    async def _retire(self, retiring: list[_SegmentSender], layout: SegmentLayout) -> None:
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


# --- public API ---------------------------------------------------------------------------


class Producer:
    """Publish to a scalable topic; thread-safe, usable in Ray tasks and actors."""

    def __init__(
        self, topic: str, *, token: str | None = None, address: str | None = None, **config: Any
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) needs ``produce`` on the topic's
        namespace when the cluster has an auth policy; a refusal is raised here.
        ``address``: the Ray to join when this process is not connected yet (see
        ``runtime.connect``; by default ``RAY_ADDRESS`` or the embedded Ray). Bad
        arguments are refused before any Ray is joined or started."""
        name, settings = TopicName.parse(topic), ProducerConfig(**config)
        joined(address)
        self._setup(name, settings, client_credential(token))
        self._open()  # fail fast here (refused, unknown topic...), not at the first send
        freeze_what_exists()

    def _setup(self, topic: TopicName, config: ProducerConfig, credential: str | None) -> None:
        self._topic = topic
        self._config = config
        self._credential = credential
        self._loop = background_loop()
        self._core: _ProducerCore | None = None
        self._open_lock = threading.Lock()
        self._pending: set[concurrent.futures.Future] = set()
        self._failed: list[SendFuture] = []
        self._pending_lock = threading.Lock()
        self._closed = False

    def _open(self) -> _ProducerCore:
        with self._open_lock:
            if self._core is None:
                self._core = self._loop.run(self._start_core())
                with _OPEN_LOCK:
                    _OPEN.add(self)
            return self._core

    async def _start_core(self) -> _ProducerCore:
        watch = await DagWatch.open(self._topic, self._credential, Permission.PRODUCE)
        core = _ProducerCore(self._topic, self._config, watch, self._credential)
        core.start()
        return core

    @property
    def topic(self) -> str:
        return str(self._topic)

    @property
    def producer_id(self) -> str:
        return self._open().producer_id

    def send(
        self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None
    ) -> concurrent.futures.Future:
        """Queue one message; the future resolves to its ``MessageId`` once stored."""
        self._check_open()
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"value must be bytes, got {type(value).__name__}")
        if key is not None and not isinstance(key, str):
            raise InvalidArgumentError(f"key must be a str or None, got {type(key).__name__}")
        if properties is not None and not isinstance(properties, dict):
            raise InvalidArgumentError("properties must be a dict of str to str")
        core, sink = self._open(), _MessageSink()
        size = len(value) + (len(key.encode()) if key else 0)
        core.limits.current.check_message(size)
        core.charge(size + _ROW_OVERHEAD)
        self._track(sink.future)
        core.submit(("one", bytes(value), key, properties, sink), 1)
        return sink.future

    async def send_async(
        self, value: bytes, key: str | None = None, properties: dict[str, str] | None = None
    ) -> MessageId:
        return await asyncio.wrap_future(self.send(value, key, properties))

    def send_batch(
        self, values: Any, keys: Any = None, properties: Any = None
    ) -> concurrent.futures.Future:
        """Queue whole columns (lists, NumPy or Arrow arrays); resolves to a ``BatchResult``.

        Hashing and partitioning are vectorized: this is the path bulk writers use.
        """
        self._check_open()
        batch = make_batch(values, keys, properties)
        sink = _BulkSink(batch.num_rows)
        if batch.num_rows == 0:
            sink.future.set_result(BatchResult(sink.segment_ids, sink.offsets))
            return sink.future
        core = self._open()
        core.limits.current.check_message(int(message_sizes(batch).max()))
        core.charge(_charge(batch))
        self._track(sink.future)
        core.submit(("bulk", batch, sink), batch.num_rows)
        return sink.future

    async def send_batch_async(
        self, values: Any, keys: Any = None, properties: Any = None
    ) -> BatchResult:
        return await asyncio.wrap_future(self.send_batch(values, keys, properties))

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is stored or failed, or ``timeout_s``.

        Like Kafka's ``flush``, it raises nothing: each send's future carries its own
        outcome. A failure that no caller looks at is not dropped: ``close()`` (and
        leaving a ``with`` block) raises ``UnseenSendFailuresError`` for it.
        """
        with self._pending_lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending, timeout=timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop. With ``timeout_s`` (Kafka's ``close(timeout)``), sends still
        unanswered by then fail with ``SendTimeoutError``: each may or may not be stored.

        Raises ``UnseenSendFailuresError`` (how many, and the first cause) when sends
        failed whose futures nobody looked at; the producer is closed either way.
        """
        self._shut(timeout_s)
        self._raise_unseen()

    def _shut(self, timeout_s: float | None) -> None:
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        with _OPEN_LOCK:
            _OPEN.discard(self)
        if self._core is not None:
            self._loop.run(self._core.close())
        self._loop.run(self._abandon(timeout_s))

    def _raise_unseen(self) -> None:
        with self._pending_lock:
            unseen = [f for f in self._failed if not f.observed]
            self._failed.clear()
        if unseen:
            first = unseen[0]._failure()
            raise UnseenSendFailuresError(
                f"{len(unseen)} send{'s' if len(unseen) > 1 else ''} to {self._topic} failed "
                f"and no caller looked at {'their futures' if len(unseen) > 1 else 'its future'}"
                f" (the first: {type(first).__name__}: {first}); those messages were not "
                "stored (or, after a time-out, may not have been)",
                len(unseen),
            )

    async def _abandon(self, timeout_s: float | None) -> None:
        """On the loop, where every answer is set: no race with a late one."""
        with self._pending_lock:
            unanswered = list(self._pending)
        error = SendTimeoutError(
            f"producer for {self._topic} closed (timeout_s={timeout_s}) with this send "
            "unanswered: it may or may not be stored"
        )
        for future in unanswered:
            if not future.done():
                future.set_exception(error)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._shut(None)
        if exc_type is None:  # never mask the exception that is leaving the block
            self._raise_unseen()

    def __reduce__(self) -> tuple:
        """Shipping a producer to a Ray task or actor gives a fresh one there, opened on
        first use: Ray calls made while Ray unpickles task arguments would deadlock. Its
        credential goes with it, as any argument of the task does."""
        return (_reopen, (str(self._topic), self._config, self._credential))

    def _track(self, future: SendFuture) -> None:
        with self._pending_lock:
            self._pending.add(future)
        future._watch(self._untrack)

    def _untrack(self, future: SendFuture) -> None:
        failed = future._failure() is not None
        with self._pending_lock:
            self._pending.discard(future)
            if failed:
                self._failed.append(future)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"producer for {self._topic} is closed")


def _reopen(topic: str, config: ProducerConfig, credential: str | None) -> Producer:
    """A fresh producer (its own id): two live producers must never share one."""
    producer = Producer.__new__(Producer)
    config = dataclasses.replace(config, producer_id=None)
    producer._setup(TopicName.parse(topic), config, credential)
    return producer


def _close_open_producers() -> None:
    with _OPEN_LOCK:
        still_open = list(_OPEN)
    for producer in still_open:
        try:
            producer.close(_AT_EXIT_TIMEOUT_S)
        except Exception as err:  # at exit nobody can catch it: say it
            print(f"raytopics: closing {producer.topic} at exit: {err}", file=sys.stderr)


# Closed while everything a close needs still runs. That is before ``atexit``: by then
# Python refuses new threads, which an executor (a DNS lookup, a file) may need.
# Threading's exit hooks run once the main thread is done, last registered first, so
# this one runs before the hook of ``concurrent.futures`` (imported above) stops
# executors.
threading._register_atexit(_close_open_producers)  # type: ignore[attr-defined]
