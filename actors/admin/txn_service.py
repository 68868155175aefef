"""The admin service's transaction operations: the transaction coordinator.

Clients read no metadata store, so a transaction's record (``storage.transactions``)
is begun, decided and finished here, with the caller's credential checked first.
Which segments a transaction wrote is recorded by the segments themselves
(``actors.segment.actor``: a segment joins a transaction before storing its first
batch of it), so no client can leave one out.

Finishing a decided transaction (``finish``) writes its marker to every joined
segment with the system's own credential, then, for a commit, applies its pending
acknowledgements, then records ``Finish``. Every step is idempotent, so whoever finds
a decided record unfinished (the caller that decided it, or the sweeper after that
caller's crash, or this actor's restart) finishes it again the same way. The sweeper
runs in this actor once a second from its first transaction operation on: it aborts
open transactions past their deadline and finishes decided ones left unfinished
(``runtime.transactions.needs_sweep``).

A mixin of ``actors.admin.service.AdminService``, which provides ``_guard`` and
``_catalog``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated, Any

from pydantic import Field

from actors.admin.auth import EVERY_NAMESPACE
from actors.admin.permits import admin_operation
from actors.guard import INTERNAL_PRINCIPAL, Guard
from actors.segment.lookup import find_segment_actor
from runtime.auth import Permission
from runtime.errors import NotFoundError, ScalableTopicsError
from runtime.names import SegmentName
from runtime.remote import call
from runtime.transactions import (
    DEFAULT_TIMEOUT_S,
    MAX_TIMEOUT_S,
    MIN_TIMEOUT_S,
    Abort,
    Acknowledge,
    Commit,
    Expire,
    Finish,
    PendingAck,
    TxnRecord,
    TxnStatus,
    Update,
    ack_calls,
    check_holder,
    forgettable,
    needs_sweep,
)
from storage.catalog import Catalog
from storage.transactions import Transactions

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
SEGMENT_TIMEOUT_S = 30.0
# How long past its transaction's deadline a message stays held for it: by then the
# transaction is decided, and finished unless its coordinator is still down.
HOLD_MARGIN_S = 60.0

TxnTimeout = Annotated[float | int, Field(ge=MIN_TIMEOUT_S, le=MAX_TIMEOUT_S)]


class TransactionOperations:
    _catalog: Catalog
    _guard: Guard
    _sweeper: asyncio.Task | None = None
    _asked: int = 0  # transaction operations seen: a sweeper stops only if none came since

    @admin_operation
    async def new_transaction(
        self,
        timeout_s: TxnTimeout = DEFAULT_TIMEOUT_S,
        owner: str | None = None,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """An open transaction; ``owner`` (Kafka's ``transactional.id``) fences the owner's
        transaction before it, which can then no longer commit; one that had decided to
        commit is finished first, so that the owner's new incarnation reads what it
        acknowledged as acknowledged."""
        self._sweep_from_now_on()
        begin = self._transactions().begin_after
        principal = self._principal(credential)
        record, previous = await asyncio.to_thread(begin, float(timeout_s), owner, principal)
        if previous is not None and not previous.status.finished:
            await self._finish(previous)
        return shown(record)

    @admin_operation
    async def sweep_transactions(self, *, credential: str | None = None) -> None:
        """Start the sweeper now (it runs from then on): a segment that opens holding an
        undecided transaction asks, since after a restart of Ray no client may."""
        self._sweep_from_now_on()

    @admin_operation
    async def get_transaction(self, txn_id: str, *, credential: str | None = None) -> dict:
        return shown(await self._held(credential, txn_id, "see"))

    @admin_operation
    async def list_transactions(self, *, credential: str | None = None) -> list[dict[str, Any]]:
        """Every transaction not yet forgotten: open, being finished, and finished."""
        return [shown(record) for record in await asyncio.to_thread(self._transactions().all)]

    @admin_operation
    async def transaction_acknowledge(
        self,
        segment: SegmentName,
        txn_id: str,
        subscription: str,
        offset: Annotated[int, Field(ge=0)],
        cumulative: bool = False,
        *,
        credential: str | None = None,
    ) -> dict[str, Any]:
        """An acknowledgement of ``subscription`` that applies when ``txn_id`` commits.
        A single message's is held in the segment first (``hold_acknowledgements``:
        Pulsar's pending ack), so that no ack time-out hands it to another consumer
        while the transaction is open, and no other transaction takes it too."""
        self._sweep_from_now_on()
        ack = PendingAck(str(segment), subscription, offset, cumulative)
        transactions = self._transactions()
        record = await self._held(credential, txn_id, "acknowledge in")
        if not cumulative and record.status is TxnStatus.OPEN:
            hold_s = max(record.deadline_ms - transactions.now_ms(), 0) / 1000 + HOLD_MARGIN_S
            await self._on_segment(
                ack.segment, "hold_acknowledgements", subscription, [offset], txn_id, hold_s,
                credential=self._guard.internal_token(),
            )  # fmt: skip
        try:
            changed = await asyncio.to_thread(transactions.change, txn_id, Acknowledge((ack,)))
        except ScalableTopicsError:
            if not cumulative:  # decided meanwhile: its finishing did not know of this hold
                await self._release(txn_id, [(ack.segment, subscription)])
            raise
        return shown(changed)

    @admin_operation
    async def commit_transaction(self, txn_id: str, *, credential: str | None = None) -> dict:
        """Decide to commit, then finish: once this returns, every message of the
        transaction is readable and its acknowledgements applied."""
        return await self._decide(credential, txn_id, Commit())

    @admin_operation
    async def abort_transaction(self, txn_id: str, *, credential: str | None = None) -> dict:
        """Decide to abort, then finish: none of its messages will ever be read."""
        return await self._decide(credential, txn_id, Abort())

    # --- finishing ----------------------------------------------------------------------

    async def _decide(
        self, credential: str | None, txn_id: str, decision: Commit | Abort
    ) -> dict[str, Any]:
        self._sweep_from_now_on()
        doing = "commit" if isinstance(decision, Commit) else "abort"
        record = await self._change_as(credential, txn_id, decision, doing)
        return shown(await self._finish(record))

    async def _change_as(
        self, credential: str | None, txn_id: str, update: Update, doing: str
    ) -> TxnRecord:
        """``update`` applied for the caller, once it is found to hold the transaction
        (``check_holder``: who began a transaction never changes, so checking first and
        then swapping leaves no gap)."""
        await self._held(credential, txn_id, doing)
        return await asyncio.to_thread(self._transactions().change, txn_id, update)

    async def _held(self, credential: str | None, txn_id: str, doing: str) -> TxnRecord:
        """The transaction's record, once the caller is found to hold it (``check_holder``)."""
        record = await asyncio.to_thread(self._transactions().get, txn_id)
        check_holder(record, self._acting_as(credential), doing)
        return record

    # --- who asks -----------------------------------------------------------------------

    def _principal(self, credential: str | None) -> str | None:
        """The name of the principal a transaction begun with ``credential`` belongs to
        (``None``: authentication is off, or the system's own credential)."""
        principal = self._guard.authenticate(credential)
        return None if principal in (None, INTERNAL_PRINCIPAL) else principal.name

    def _acting_as(self, credential: str | None) -> str | None:
        """Whom ``check_holder`` compares with the transaction's principal: ``None`` for
        whoever may act on every transaction (an admin of every namespace, the system)."""
        principal = self._guard.authenticate(credential)
        if principal is None or principal.may(Permission.ADMIN, EVERY_NAMESPACE):
            return None
        return principal.name

    async def _finish(self, record: TxnRecord) -> TxnRecord:
        """Markers to every segment the transaction joined, its acknowledgements if it
        commits, then ``Finish``; a segment that was deleted has nothing to mark."""
        if record.status.finished:
            return record
        committed = record.status.commits
        internal = self._guard.internal_token()
        await asyncio.gather(
            *(self._on_segment(s.segment, "mark", record.txn_id, committed, credential=internal)
              for s in record.segments)
        )  # fmt: skip
        if not committed:
            held = sorted({(a.segment, a.subscription) for a in record.acks if not a.cumulative})
            await self._release(record.txn_id, held)
        if committed:
            await asyncio.gather(
                *(self._on_segment(segment, "ack_cumulative" if cumulative else "ack",
                                   subscription, offsets, credential=internal)
                  for segment, subscription, cumulative, offsets in ack_calls(record.acks))
            )  # fmt: skip
        change = self._transactions().change
        return await asyncio.to_thread(change, record.txn_id, Finish())

    async def _release(self, txn_id: str, held: list[tuple[str, str]]) -> None:
        """Deliver again what ``txn_id`` held of each (segment, subscription) in ``held``."""
        internal = self._guard.internal_token()
        await asyncio.gather(
            *(self._on_segment(segment, "release_acknowledgements", subscription, txn_id,
                               credential=internal)
              for segment, subscription in held)
        )  # fmt: skip

    async def _on_segment(self, segment: str, method: str, *args: Any, **kwargs: Any) -> None:
        name = SegmentName.parse(segment)
        try:
            handle = await find_segment_actor(
                name, SEGMENT_TIMEOUT_S, credential=kwargs.get("credential")
            )
            await call(getattr(handle, method).remote(*args, **kwargs))
        except NotFoundError:
            return  # the segment (or its topic, or the subscription) was deleted

    # --- the sweeper --------------------------------------------------------------------

    def _sweep_from_now_on(self) -> None:
        self._asked += 1
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        """Sweep once a second until no transaction record is left (the last one is
        forgotten), unless a transaction operation came meanwhile: an idle cluster reads
        nothing each second, and the next operation starts it again."""
        while True:
            asked, left = self._asked, 1
            with contextlib.suppress(Exception):
                left = await self._sweep_once()
            if left == 0 and asked == self._asked:
                return
            await asyncio.sleep(SWEEP_INTERVAL_S)

    async def _sweep_once(self) -> int:
        """Abort what outlived its deadline, finish what was decided and left; how many
        records there were."""
        transactions = self._transactions()
        records = await asyncio.to_thread(transactions.all)
        now = transactions.now_ms()
        for record in records:
            if forgettable(record, now):
                await asyncio.to_thread(transactions.forget, record.txn_id)
                continue
            if not needs_sweep(record, now):
                continue
            try:
                if not record.status.decided:
                    record = await asyncio.to_thread(transactions.change, record.txn_id, Expire())
                await self._finish(record)
            except ScalableTopicsError as err:
                log.warning("transaction %s: not finished yet: %s", record.txn_id, err)
        return len(records)

    def _transactions(self) -> Transactions:
        return Transactions(self._catalog.store)


def shown(record: TxnRecord) -> dict[str, Any]:
    """A record as the API answers it."""
    return {
        "txnId": record.txn_id,
        "status": record.status.value,
        "startedMs": record.started_ms,
        "deadlineMs": record.deadline_ms,
        "owner": record.owner,
        "principal": record.principal,
        "segments": sorted(s.segment for s in record.segments),
        "acknowledgements": len(record.acks),
        "reason": record.reason,
    }
