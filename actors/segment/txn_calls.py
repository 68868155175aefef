"""What a segment does for the transaction coordinator (``actors.admin.txn_service``):
write a transaction's fate after its records, and hold the queue messages acknowledged
in a transaction until it is decided.

Only the system's own credential may call these: a marker decides what every reader
gets, and a hold keeps a message from every other consumer.

A mixin of ``actors.segment.actor.Segment``, which provides the attributes declared here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.guard import Guard
from actors.segment.reader import SegmentReader
from actors.segment.replication import ReplicaRoles
from actors.segment.txn_joins import TxnJoins
from storage.segment_store import SegmentStore


class TransactionCalls:
    _store: SegmentStore
    _guard: Guard
    _joins: TxnJoins
    _roles: ReplicaRoles
    _reader: SegmentReader

    if TYPE_CHECKING:

        def _still_open(self) -> None: ...
        def _appended(self) -> None: ...

    async def mark(self, txn_id: str, committed: bool, *, credential: str | None = None) -> int:
        """Write transaction ``txn_id``'s fate after its records here
        (``SegmentStore.mark``) and return the marker's offset, once it is committed (on
        a replicated segment: on a quorum, so no failover takes it back)."""
        self._still_open()
        self._roles.check_serves()
        self._guard.check_internal(credential, "decide a transaction")
        offset = self._store.mark(txn_id, committed)
        self._joins.forget(txn_id)
        self._appended()
        if self._roles.leader is not None:
            await self._roles.leader.committed(offset + 1)
        return offset

    async def hold_acknowledgements(
        self,
        subscription: str,
        offsets: list[int],
        txn_id: str,
        hold_s: float,
        *,
        credential: str | None = None,
    ) -> None:
        """Hold ``offsets`` of queue ``subscription`` for ``txn_id``, which acknowledges
        them when it commits (Pulsar's pending ack): until it is decided, or ``hold_s``
        at most, no ack time-out hands them to another consumer.
        ``TransactionConflictError`` when another transaction holds one."""
        self._still_open()
        self._roles.check_serves()
        self._guard.check_internal(credential, "hold messages for a transaction")
        self._store.hold(subscription, offsets, txn_id, hold_s)

    async def release_acknowledgements(
        self, subscription: str, txn_id: str, *, credential: str | None = None
    ) -> None:
        """``txn_id`` aborted: what it held of ``subscription`` is delivered again."""
        self._still_open()
        self._guard.check_internal(credential, "release a transaction's messages")
        if self._store.release(subscription, txn_id):
            self._reader.wake()
