"""A queue subscription's dispatch in one segment (``SegmentStore``'s part): which
consumer holds which message, redeliveries after a negative ack or the ack time-out,
and reading the offsets handed out (``runtime.dispatch`` keeps the rules)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import pyarrow as pa

from runtime.batch import REDELIVERIES_KEY
from runtime.dispatch import QueueDispatcher
from storage.cursors import CursorStore
from storage.log import SegmentRecords, to_delivery


class QueueParts:
    """What queue dispatch needs of the store (``SegmentStore`` provides each)."""

    log: SegmentRecords
    cursors: CursorStore
    _dispatchers: dict[str, QueueDispatcher]
    _ack_timeout_s: float

    @property
    def readable_end(self) -> int: ...

    def position(self, subscription: str) -> int: ...

    def _check_alive(self) -> None: ...

    def negative_ack(
        self,
        subscription: str,
        offsets: Iterable[int],
        consumer: str | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Pass ``consumer`` so a late nack cannot free offsets another consumer now holds;
        ``delay_s``: redeliver no sooner (the consumer's backoff)."""
        dispatcher = self._dispatcher(subscription)
        dispatcher.negative_ack(offsets, consumer, delay_s, time.monotonic())

    def redelivery_due_in(self, subscription: str) -> float | None:
        """Seconds until a delayed redelivery of ``subscription`` is due, if one waits."""
        dispatcher = self._dispatchers.get(subscription)
        return dispatcher.due_in(time.monotonic()) if dispatcher is not None else None

    def queue_receive(self, subscription: str, consumer: str, max_records: int) -> pa.RecordBatch:
        """Messages no other queue consumer of this subscription currently holds; how often
        each was delivered before is in the batch's schema metadata (``REDELIVERIES_KEY``:
        offset → count, for those delivered before)."""
        self._check_alive()
        cursor = self.cursors.get(subscription)
        dispatcher = self._dispatcher(subscription)
        offsets = dispatcher.take(
            consumer, max_records, self.readable_end, cursor.is_acked, time.monotonic()
        )
        batch = self._read_offsets(offsets)
        counts = dispatcher.redeliveries(offsets)
        again = {str(o): n for o, n in zip(offsets, counts, strict=True) if n}
        if not again:
            return batch
        return batch.replace_schema_metadata({REDELIVERIES_KEY: json.dumps(again)})

    def hold(self, subscription: str, offsets: Iterable[int], txn_id: str, hold_s: float) -> None:
        """Hold ``offsets`` for a transaction that acknowledges them when it commits, for
        at most ``hold_s`` (``QueueDispatcher.hold``). Not persisted: a restarted segment
        delivers them again, as every unacknowledged message."""
        self._check_alive()
        cursor = self.cursors.get(subscription)
        dispatcher = self._dispatcher(subscription)
        dispatcher.hold(offsets, txn_id, cursor.is_acked, time.monotonic(), hold_s)

    def release(self, subscription: str, txn_id: str) -> list[int]:
        """Deliver again what ``txn_id`` held (it aborted); the offsets."""
        dispatcher = self._dispatchers.get(subscription)
        return dispatcher.release(txn_id) if dispatcher is not None else []

    def consumer_left(self, subscription: str, consumer: str) -> None:
        if subscription in self._dispatchers:
            self._dispatchers[subscription].consumer_left(consumer)

    def _dispatcher(self, subscription: str) -> QueueDispatcher:
        dispatcher = self._dispatchers.get(subscription)
        if dispatcher is None:
            start = self.position(subscription)
            dispatcher = QueueDispatcher(ack_timeout_s=self._ack_timeout_s, next_offset=start)
            self._dispatchers[subscription] = dispatcher
        return dispatcher

    def _read_offsets(self, offsets: list[int]) -> pa.RecordBatch:
        batches = []
        for start, count in _runs(offsets):
            batches.extend(self.log.read(start, count))
        return to_delivery(batches)


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Group sorted-ish offsets into (start, length) runs of consecutive offsets."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((offset, 1))
    return runs
