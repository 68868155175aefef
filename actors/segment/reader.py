"""How a segment serves readers, from Ray calls and data-plane frames alike: stream
consumers' reads and shares, queue consumers' takes and settlements, and the long-polls
they wait in.

A plain object, not actor methods, as ``actors.segment.appender`` is: Ray wraps every
actor method for tracing, a cost the data plane would pay per frame. Long-polls wait on
one event per segment, set when there is something new to look at (an append, entries
committed by a replicated segment's quorum, messages a queue consumer handed back), so a
waiting reader costs no task and no timer beyond its own time-out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pyarrow as pa

from actors.metrics import SegmentMetrics
from actors.segment.flusher import IntervalFlusher
from runtime import wire
from runtime.batch import ipc_parts
from runtime.errors import InvalidArgumentError
from storage.segment_store import SegmentStore

MAX_READ_RECORDS = 100_000
MAX_READ_WAIT_S = 60.0
# The longest a negative acknowledgement may hold a message back (a day).
MAX_REDELIVERY_DELAY_S = 86_400.0


class SegmentReader:
    """Who calls: the segment actor, for its Ray calls and the data plane's frames that
    wait; ``wake`` whoever has something new for long-polling readers. What it affects:
    the store's cursors and queue dispatch, and the segment's delivery metrics."""

    def __init__(
        self,
        store: SegmentStore,
        metrics: SegmentMetrics,
        ack_saver: IntervalFlusher | None,
        touched: Callable[[], None],
        check_open: Callable[[], None],
    ) -> None:
        """``touched``: a reader used the segment (it is not idle); ``check_open``: raise
        once the segment closed (a long-poll that ends after it)."""
        self._store, self._metrics, self._ack_saver = store, metrics, ack_saver
        self._touched, self._check_open = touched, check_open
        self._new_data = asyncio.Event()

    def wake(self) -> None:
        self._new_data.set()
        self._new_data = asyncio.Event()

    async def wait(self, wait_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):  # no task per long-poll, unlike wait_for
                await self._new_data.wait()

    async def take(
        self, subscription: str, consumer: str, max_records: int, wait_s: float
    ) -> pa.RecordBatch:
        """A queue consumer's messages: those no other consumer of ``subscription``
        holds, waiting up to ``wait_s`` for some (or for a delayed redelivery to fall
        due) when there are none."""
        self._touched()
        store = self._store
        max_records = min(max_records, MAX_READ_RECORDS)
        batch = store.queue_receive(subscription, consumer, max_records)
        due_in = store.redelivery_due_in(subscription)
        waits = not store.sealed_for_readers or due_in is not None
        if batch.num_rows == 0 and wait_s > 0 and waits:
            wait_s = min(wait_s, MAX_READ_WAIT_S)
            await self.wait(wait_s if due_in is None else min(wait_s, due_in))
            self._check_open()
            batch = store.queue_receive(subscription, consumer, max_records)
        self._metrics.delivered(batch.num_rows, batch.nbytes)
        return batch

    def settle(self, request: wire.SettleRequest) -> bytes:
        """A queue consumer's acknowledgement, negative acknowledgement (after its delay,
        the consumer's backoff) or goodbye (what it holds goes back at once)."""
        self._touched()
        store, subscription = self._store, request.subscription
        if request.kind is wire.Settle.ACK:
            store.ack(subscription, request.offsets)
            return wire.encode_ok(0, len(request.offsets))
        if request.kind is wire.Settle.NEGATIVE_ACK:
            if not 0 <= request.delay_s <= MAX_REDELIVERY_DELAY_S:
                raise InvalidArgumentError(
                    f"a redelivery delay must be between 0 and {MAX_REDELIVERY_DELAY_S:g} "
                    f"seconds, got {request.delay_s:g}"
                )
            store.negative_ack(subscription, request.offsets, request.consumer, request.delay_s)
        else:
            store.consumer_left(subscription, request.consumer)
        self.wake()  # long-polling queue consumers can take what came back
        return wire.encode_ok(0, len(request.offsets))

    async def read(self, offset: int, max_records: int, wait_s: float) -> pa.RecordBatch:
        """The read of a Ray call and of the data plane alike (not the actor method
        itself: Ray wraps those for tracing)."""
        max_records = min(max_records, MAX_READ_RECORDS)
        self._touched()
        if wait_s > 0 and max_records > 0 and self._store.waits_at(offset):
            await self.wait(min(wait_s, MAX_READ_WAIT_S))  # nothing yet: read once woken
            self._check_open()
        batch = self._store.read(offset, max_records)
        self._metrics.delivered(batch.num_rows, batch.nbytes)
        return batch

    async def read_share(self, request: wire.ShareRead) -> bytes:
        """A stream subscription's consumer reading its share (``wire``'s ``share``): the
        cumulative ack it carries first, then a long-poll only when nothing is left to
        look at, not when what was looked at was all for other buckets."""
        store, subscription = self._store, request.subscription
        if request.ack is not None:
            self.ack_with_read(subscription, request.ack)
        max_records = min(request.max_records, MAX_READ_RECORDS)
        self._touched()
        start = store.share_start(subscription, request.offset)
        if request.wait_s > 0 and store.waits_at(start):
            await self.wait(min(request.wait_s, MAX_READ_WAIT_S))
            self._check_open()
        buckets = (request.start, request.end, request.count)
        batch, following = store.read_share(subscription, request.offset, max_records, buckets)
        self._metrics.delivered(batch.num_rows, batch.nbytes)
        return wire.encode_shared(
            store.readable_end, store.sealed_for_readers, following, ipc_parts(batch)
        )

    def ack_with_read(self, subscription: str, offset: int) -> None:
        """A stream consumer's cumulative ack on its next read: saved by the ack saver,
        whereas an ack called for (a consumer releasing or finishing a segment) is saved
        before its call returns."""
        saver = self._ack_saver
        if self._store.ack_cumulative(subscription, offset, save_later=saver is not None):
            assert saver is not None
            saver.changed()
