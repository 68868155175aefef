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

A process that is not a Ray driver produces through the REST gateway (``url=``, or
``RAYTOPICS_URL``): the layout, its changes and the segments' addresses come from the
gateway (``clients._remote``), the records go over the same data plane, and nothing
imports Ray.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread  # noqa: F401 - its exit hook first, see below
import dataclasses
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any, Literal

from clients._gc import freeze_what_exists
from clients._install import ray_required
from clients._limits import ClusterLimits
from clients._loop import background_loop
from clients._producer_core import ProducerCore
from clients._remote import gateway_url
from clients._send_results import ROW_OVERHEAD, BulkSink, MessageSink, SendFuture, charge_of
from clients.message import BatchResult, MessageId
from clients.transaction import Transaction, _transaction_id
from runtime.auth import Permission, client_credential
from runtime.batch import (
    check_compression,
    make_batch,
    message_sizes,
)
from runtime.connect import before_disconnect
from runtime.errors import (
    ClientClosedError,
    InvalidArgumentError,
    SendTimeoutError,
    UnseenSendFailuresError,
)
from runtime.names import TopicName

logger = logging.getLogger(__name__)

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


# --- public API ---------------------------------------------------------------------------


class Producer:
    """Publish to a scalable topic; thread-safe, usable in Ray tasks and actors."""

    def __init__(
        self,
        topic: str,
        *,
        token: str | None = None,
        address: str | None = None,
        url: str | None = None,
        **config: Any,
    ) -> None:
        """``token`` (default ``RAYTOPICS_TOKEN``) needs ``produce`` on the topic's
        namespace when the cluster has an auth policy; a refusal is raised here.
        ``address``: the Ray to join when this process is not connected yet (see
        ``runtime.connect``; by default ``RAY_ADDRESS`` or the embedded Ray). ``url``
        (default ``RAYTOPICS_URL`` when no ``address`` is given): the REST gateway to
        produce through instead, from a process that never joins Ray. Bad arguments are
        refused before any Ray is joined or started."""
        name, settings = TopicName.parse(topic), ProducerConfig(**config)
        url = gateway_url(url, address)
        if url is not None and settings.transport == "ray":
            raise InvalidArgumentError("a producer through the gateway (url=) sends over 'tcp'")
        if url is None:
            with ray_required("a Producer without url= (a Ray driver's)"):
                from clients._ray import joined

            joined(address)
        self._setup(name, settings, client_credential(token), url)
        self._open()  # fail fast here (refused, unknown topic...), not at the first send
        freeze_what_exists()

    def _setup(
        self, topic: TopicName, config: ProducerConfig, credential: str | None, url: str | None
    ) -> None:
        self._topic = topic
        self._config = config
        self._credential = credential
        self._url = url
        self._loop = background_loop()
        self._core: ProducerCore | None = None
        self._open_lock = threading.Lock()
        self._pending: set[concurrent.futures.Future] = set()
        self._failed: list[SendFuture] = []
        self._pending_lock = threading.Lock()
        self._closed = False

    def _open(self) -> ProducerCore:
        with self._open_lock:
            if self._core is None:
                self._core = self._loop.run(self._start_core())
                with _OPEN_LOCK:
                    _OPEN.add(self)
            return self._core

    async def _start_core(self) -> ProducerCore:
        if self._url is not None:
            return await self._start_remote_core(self._url)
        from actors.control.dag_watch import DagWatch
        from clients._ray import segment_access

        watch = await DagWatch.open(self._topic, self._credential, Permission.PRODUCE)
        try:
            limits = await ClusterLimits.open(self._topic.namespace_path, self._credential)
        except BaseException:
            await watch.close()
            raise
        access = segment_access(self._credential)
        core = ProducerCore(self._topic, self._config, watch, limits, self._credential, access)
        core.start()
        return core

    async def _start_remote_core(self, url: str) -> ProducerCore:
        """Through the gateway: the layout once a segment admits the token for
        ``produce`` (``RemoteCluster.admitted_watch``), then the limits."""
        from clients._remote import RemoteCluster
        from runtime import wire

        cluster = RemoteCluster(url, self._credential)
        watch = await cluster.admitted_watch(self._topic, wire.PRODUCE)
        try:
            limits = await ClusterLimits.open(
                self._topic.namespace_path, self._credential, ask=cluster.limits_of
            )
        except BaseException:
            await watch.close()
            raise
        access = cluster.segment_access()
        core = ProducerCore(self._topic, self._config, watch, limits, self._credential, access)
        core.start()
        return core

    @property
    def topic(self) -> str:
        return str(self._topic)

    @property
    def producer_id(self) -> str:
        return self._open().producer_id

    def send(
        self,
        value: bytes,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        *,
        txn: Transaction | None = None,
    ) -> concurrent.futures.Future:
        """Queue one message; the future resolves to its ``MessageId`` once stored. With
        ``txn``, the message is part of that transaction (``clients.transaction``): stored
        now, read only once it commits."""
        self._check_open()
        txn_id = _transaction_id(txn)
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"value must be bytes, got {type(value).__name__}")
        if key is not None and not isinstance(key, str):
            raise InvalidArgumentError(f"key must be a str or None, got {type(key).__name__}")
        if properties is not None and not isinstance(properties, dict):
            raise InvalidArgumentError("properties must be a dict of str to str")
        core, sink = self._open(), MessageSink()
        size = len(value) + (len(key.encode()) if key else 0)
        core.limits.current.check_message(size)
        core.charge(size + ROW_OVERHEAD)
        self._track(sink.future, txn)
        core.submit(("one", bytes(value), key, properties, sink, txn_id), 1)
        return sink.future

    async def send_async(
        self,
        value: bytes,
        key: str | None = None,
        properties: dict[str, str] | None = None,
        *,
        txn: Transaction | None = None,
    ) -> MessageId:
        return await asyncio.wrap_future(self.send(value, key, properties, txn=txn))

    def send_batch(
        self,
        values: Any,
        keys: Any = None,
        properties: Any = None,
        *,
        txn: Transaction | None = None,
    ) -> concurrent.futures.Future:
        """Queue whole columns (lists, NumPy or Arrow arrays); resolves to a ``BatchResult``.
        With ``txn``, the messages are part of that transaction, as ``send``'s.

        Hashing and partitioning are vectorized: this is the path bulk writers use.
        """
        self._check_open()
        txn_id = _transaction_id(txn)
        batch = make_batch(values, keys, properties)
        sink = BulkSink(batch.num_rows)
        if batch.num_rows == 0:
            sink.future.set_result(BatchResult(sink.segment_ids, sink.offsets))
            return sink.future
        core = self._open()
        core.limits.current.check_message(int(message_sizes(batch).max()))
        core.charge(charge_of(batch))
        self._track(sink.future, txn)
        core.submit(("bulk", batch, sink, txn_id), batch.num_rows)
        return sink.future

    async def send_batch_async(
        self,
        values: Any,
        keys: Any = None,
        properties: Any = None,
        *,
        txn: Transaction | None = None,
    ) -> BatchResult:
        return await asyncio.wrap_future(self.send_batch(values, keys, properties, txn=txn))

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
        return (_reopen, (str(self._topic), self._config, self._credential, self._url))

    def _track(self, future: SendFuture, txn: Transaction | None = None) -> None:
        with self._pending_lock:
            self._pending.add(future)
        future._watch(self._untrack)
        if txn is not None:
            txn._sent(future)  # its commit waits for it, and aborts if it failed

    def _untrack(self, future: SendFuture) -> None:
        failed = future._failure() is not None
        with self._pending_lock:
            self._pending.discard(future)
            if failed:
                self._failed.append(future)

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"producer for {self._topic} is closed")


def _reopen(
    topic: str, config: ProducerConfig, credential: str | None, url: str | None = None
) -> Producer:
    """A fresh producer (its own id): two live producers must never share one."""
    producer = Producer.__new__(Producer)
    config = dataclasses.replace(config, producer_id=None)
    producer._setup(TopicName.parse(topic), config, credential, url)
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
# And before a program leaves Ray, whose actors a close still calls.
before_disconnect(_close_open_producers, first=True)
