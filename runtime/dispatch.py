"""Queue dispatch for one subscription of one segment (shared, unordered consumption).

Several queue consumers pull from the same subscription; each pull hands out
offsets nobody else holds, so consumers naturally get different messages
(round robin by arrival of their pulls). Handed-out offsets stay *in flight*
until acknowledged; a negative ack, an ack timeout or a consumer leaving puts
them back in front of the line, a negative ack after a delay when the consumer asks
for one (its redelivery backoff). Each offset's deliveries are counted, so a consumer
knows how often a message came back (and may dead-letter it). Nothing here is
persisted: after a restart all unacknowledged messages are simply redelivered, with
their counts from zero, which is the at-least-once contract of a queue subscription.

An offset acknowledged in a transaction is *held* for it (Pulsar's pending ack) until
the transaction is decided: no ack timeout and no consumer leaving hands it out again
meanwhile, and another transaction may not acknowledge it too. Its commit acknowledges
it; its abort puts it back in line.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from runtime.errors import TransactionConflictError


@dataclass
class _InFlight:
    """Who holds an offset handed out: a consumer until its ack deadline, or a
    transaction (``txn``: its id) until it is decided. Kept apart, so that no consumer's
    name can pass for a transaction's."""

    consumer: str | None
    deadline: float
    txn: str | None = None


@dataclass
class QueueDispatcher:
    ack_timeout_s: float = 30.0
    next_offset: int = 0  # first offset never handed out
    _in_flight: dict[int, _InFlight] = field(default_factory=dict)
    _redeliver: list[int] = field(default_factory=list)  # min-heap of offsets
    _deadlines: deque[tuple[float, list[int]]] = field(default_factory=deque)
    _delayed: list[tuple[float, int]] = field(default_factory=list)  # (due, offset) min-heap
    _deliveries: dict[int, int] = field(default_factory=dict)  # unacknowledged offsets only
    _hold_ends: list[tuple[float, int]] = field(default_factory=list)  # transactions' holds

    def take(
        self,
        consumer: str,
        max_records: int,
        end_offset: int,
        is_acked: Callable[[int], bool],
        now: float,
    ) -> list[int]:
        """Offsets for ``consumer``: redeliveries first (lowest offset first), then new ones."""
        self.expire(now)
        while self._delayed and self._delayed[0][0] <= now:
            heapq.heappush(self._redeliver, heapq.heappop(self._delayed)[1])
        taken: list[int] = []
        # An offset may be in line twice: held by a transaction from the line, then
        # released. ``_in_flight`` says who holds what; the line only says what may be due.
        chosen: set[int] = set()
        while self._redeliver and len(taken) < max_records:
            offset = heapq.heappop(self._redeliver)
            if offset not in self._in_flight and offset not in chosen and not is_acked(offset):
                taken.append(offset)
                chosen.add(offset)
        while self.next_offset < end_offset and len(taken) < max_records:
            offset = self.next_offset
            if not is_acked(offset) and offset not in self._in_flight and offset not in chosen:
                taken.append(offset)
            self.next_offset += 1
        deadline = now + self.ack_timeout_s
        for offset in taken:
            self._in_flight[offset] = _InFlight(consumer, deadline)
            self._deliveries[offset] = self._deliveries.get(offset, 0) + 1
        if taken:
            self._deadlines.append((deadline, taken))
        return taken

    def acknowledged(self, offsets: Iterable[int]) -> None:
        for offset in offsets:
            self._in_flight.pop(offset, None)
            self._deliveries.pop(offset, None)

    def hold(
        self,
        offsets: Iterable[int],
        txn_id: str,
        is_acked: Callable[[int], bool],
        now: float,
        hold_s: float,
    ) -> None:
        """Hold ``offsets`` for transaction ``txn_id`` until ``release``, their
        acknowledgement, or ``hold_s`` after ``now`` (by then the transaction is decided
        and finished; a hold its coordinator never recorded, having crashed in between,
        ends there), whoever held them before (a consumer whose ack timeout passed
        included). ``TransactionConflictError``, holding none, when another transaction
        holds one. Who calls: the transaction coordinator, before it records the
        acknowledgement in the transaction."""
        self.expire(now)
        offsets = [o for o in offsets if not is_acked(o)]
        for offset in offsets:
            held = self._in_flight.get(offset)
            if held is not None and held.txn is not None and held.txn != txn_id:
                raise TransactionConflictError(
                    f"offset {offset} is acknowledged in transaction {held.txn} already, "
                    "not yet decided"
                )
        until = now + hold_s
        for offset in offsets:
            self._in_flight[offset] = _InFlight(None, until, txn_id)
            heapq.heappush(self._hold_ends, (until, offset))

    def release(self, txn_id: str) -> list[int]:
        """Put back in line what ``txn_id`` held (it aborted); the offsets. Who calls:
        the transaction coordinator finishing an abort."""
        held = [o for o, f in self._in_flight.items() if f.txn == txn_id]
        self.negative_ack(held)
        return held

    def redeliveries(self, offsets: Iterable[int]) -> list[int]:
        """How many times each offset was handed out before its latest delivery."""
        return [self._deliveries.get(offset, 1) - 1 for offset in offsets]

    def negative_ack(
        self,
        offsets: Iterable[int],
        consumer: str | None = None,
        delay_s: float = 0.0,
        now: float = 0.0,
    ) -> None:
        """Put held offsets back in line, at once or ``delay_s`` after ``now``. With
        ``consumer``, only that consumer's holds: a nack arriving after its hold timed
        out and the offset went to someone else must not free the new holder's offset
        for a third consumer."""
        for offset in offsets:
            held = self._in_flight.get(offset)
            if held is None or (consumer is not None and held.consumer != consumer):
                continue
            del self._in_flight[offset]
            if delay_s > 0:
                heapq.heappush(self._delayed, (now + delay_s, offset))
            else:
                heapq.heappush(self._redeliver, offset)

    def due_in(self, now: float) -> float | None:
        """Seconds until the next delayed redelivery is due (``None``: none waits)."""
        return max(self._delayed[0][0] - now, 0.0) if self._delayed else None

    def consumer_left(self, consumer: str) -> None:
        mine = [o for o, f in self._in_flight.items() if f.consumer == consumer]
        self.negative_ack(mine)

    def expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, offsets = self._deadlines.popleft()
            expired = [o for o in offsets if self._held_until(o) == deadline]
            self.negative_ack(expired)
        while self._hold_ends and self._hold_ends[0][0] <= now:
            deadline, offset = heapq.heappop(self._hold_ends)
            if self._held_until(offset) == deadline:
                self.negative_ack([offset])

    def _held_until(self, offset: int) -> float | None:
        held = self._in_flight.get(offset)
        return held.deadline if held is not None else None

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def pending_redelivery(self) -> int:
        return len(self._redeliver)
