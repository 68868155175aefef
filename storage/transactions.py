"""Transactions' records in the metadata store: one per transaction under
``/transactions/open/{txnId}``, and one per owner under ``/transactions/owners/{owner}``
(``/transactions/principals/{digest}/owners/{owner}`` with authentication on: an owner
is its principal's own; ``storage.metadata_paths.transaction_owner_path``).

``runtime.transactions`` says what a record may become; this module only reads and
swaps records, so that each named update is applied to the latest record and to
nothing else (``MetadataStore.update``: a compare-and-swap, read again when lost). The
decision to commit is that swap: of a ``commit`` and a fence or time-out racing on
one transaction, exactly one wins, and the other learns which.

An owner's record holds its epoch and the id of its newest transaction. Starting a
transaction for an owner bumps the epoch, then fences the transaction the record named
before: it aborts it, or, when that transaction's record was not written yet (its
``begin`` is still on its way), writes it already aborted, so that the late ``begin``
finds it there and fails instead of opening a stale transaction.

Who calls: clients (begin, join, acknowledge, commit, abort), and whoever finishes or
sweeps transactions. What it affects: whether a transaction's messages and
acknowledgements ever count.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable

from runtime.errors import (
    AlreadyExistsError,
    BadVersion,
    ConflictError,
    KeyNotFoundError,
    TransactionNotFoundError,
    TransactionNotOpenError,
)
from runtime.transactions import (
    DEFAULT_TIMEOUT_S,
    FENCED,
    Abort,
    Expire,
    TxnRecord,
    TxnStatus,
    Update,
    begin,
)
from storage.metadata import MetadataStore
from storage.metadata_paths import (
    TRANSACTIONS_ROOT,
    transaction_owner_path,
    transaction_path,
)

ATTEMPTS = 200  # swaps lost to concurrent writers before giving up (BadVersion)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Transactions:
    """Begin, change and list transactions' records. ``clock`` gives the time in ms
    (the wall clock: deadlines are compared across processes)."""

    def __init__(self, store: MetadataStore, clock: Callable[[], int] = _wall_ms) -> None:
        self.store, self._clock = store, clock

    def now_ms(self) -> int:
        """The time deadlines are compared with."""
        return self._clock()

    def begin(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        owner: str | None = None,
        principal: str | None = None,
    ) -> TxnRecord:
        """A new open transaction of ``principal`` (who began it: ``None`` with
        authentication off). With ``owner``, the owner's previous transaction is fenced
        first: it can no longer commit (unless it had decided to already)."""
        return self.begin_after(timeout_s, owner, principal)[0]

    def begin_after(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        owner: str | None = None,
        principal: str | None = None,
    ) -> tuple[TxnRecord, TxnRecord | None]:
        """``begin``, and the owner's previous transaction as the fence left it (``None``
        without an owner, or for its first): one that had decided to commit is still to
        be finished, which its owner's new incarnation must wait for (Kafka's
        ``initTransactions`` completes a prepared commit before it returns). Owners are
        the principal's own: another principal's owner of the same name is another."""
        txn_id = f"txn-{uuid.uuid4().hex}"
        epoch, previous = (
            self._next_epoch(transaction_owner_path(owner, principal), txn_id)
            if owner is not None
            else (0, None)
        )
        record = begin(txn_id, self._clock(), timeout_s, owner, epoch, principal)
        try:
            self.store.put_if_absent(transaction_path(txn_id), record.to_bytes())
        except AlreadyExistsError:
            raise TransactionNotOpenError(
                f"transaction {txn_id} of {owner} was fenced by a newer transaction of the "
                "same owner before it began"
            ) from None
        return record, previous

    def get(self, txn_id: str) -> TxnRecord:
        found = self.store.get(transaction_path(txn_id))
        if found is None:
            raise TransactionNotFoundError(f"no transaction {txn_id}")
        return TxnRecord.from_bytes(found.value)

    def change(self, txn_id: str, update: Update) -> TxnRecord:
        """Apply ``update`` to the latest record and return what it became. A transaction
        past its deadline is aborted first (``Expire``), and stays aborted when the
        update is then refused."""
        refused: list[TransactionNotOpenError] = []

        def mutate(raw: bytes) -> bytes | None:
            refused.clear()  # asked again after a lost swap: decided anew
            record = TxnRecord.from_bytes(raw)
            now = self._clock()
            expired = Expire().apply(record, now)
            try:
                new = update.apply(expired, now)
            except TransactionNotOpenError as err:
                if expired == record:
                    raise
                refused.append(err)  # the expiry is stored all the same
                new = expired
            return None if new == record else new.to_bytes()

        try:
            found = self.store.update(transaction_path(txn_id), mutate, attempts=ATTEMPTS)
        except KeyNotFoundError:
            raise TransactionNotFoundError(f"no transaction {txn_id}") from None
        if refused:
            raise refused[0]
        return TxnRecord.from_bytes(found.value)

    def all(self) -> list[TxnRecord]:
        """Every transaction's record, read together: what a sweeper looks through."""
        found = self.store.get_all(TRANSACTIONS_ROOT)
        return [TxnRecord.from_bytes(v.value) for _, v in sorted(found.items())]

    def forget(self, txn_id: str) -> None:
        """Remove a finished transaction's record; an unfinished one is kept."""
        path = transaction_path(txn_id)
        found = self.store.get(path)
        if found is None:
            return
        record = TxnRecord.from_bytes(found.value)
        if not record.status.finished:
            raise ConflictError(
                f"transaction {txn_id} is {record.status.value}: only a finished one is forgotten"
            )
        # removed meanwhile, or changed (a finished record changes no more): nothing to do
        with contextlib.suppress(BadVersion, KeyNotFoundError):
            self.store.delete(path, found.version)

    # --- owners ------------------------------------------------------------------------

    def _next_epoch(self, path: str, txn_id: str) -> tuple[int, TxnRecord | None]:
        """Bump the epoch of the owner at ``path``, naming ``txn_id`` its newest
        transaction, then fence the transaction it named before; the epoch, and that
        transaction's record."""
        previous: list[str | None] = [None]

        def bump(raw: bytes) -> bytes:
            body = json.loads(raw)
            previous[0] = body["txn"]
            return json.dumps({"epoch": body["epoch"] + 1, "txn": txn_id}).encode()

        try:
            self.store.put_if_absent(path, json.dumps({"epoch": 1, "txn": txn_id}).encode())
            return 1, None
        except AlreadyExistsError:
            epoch = json.loads(self.store.update(path, bump).value)["epoch"]
        return epoch, (self._fence(previous[0]) if previous[0] is not None else None)

    def _fence(self, txn_id: str) -> TxnRecord | None:
        """Abort ``txn_id`` as fenced, written aborted if its record does not exist yet;
        its record after that (``None``: forgotten since)."""
        for _ in range(ATTEMPTS):
            try:
                return self.change(txn_id, Abort(FENCED))
            except TransactionNotOpenError:
                return self._found(txn_id)  # timed out meanwhile: aborted all the same
            except TransactionNotFoundError:
                pass
            now = self._clock()
            fenced = TxnRecord(txn_id, TxnStatus.ABORTED, now, now, reason=FENCED, decided_ms=now)
            try:
                self.store.put_if_absent(transaction_path(txn_id), fenced.to_bytes())
                return fenced
            except AlreadyExistsError:
                continue  # its begin came first after all: abort that
        raise BadVersion(f"transaction {txn_id}: could not fence it in {ATTEMPTS} attempts")

    def _found(self, txn_id: str) -> TxnRecord | None:
        found = self.store.get(transaction_path(txn_id))
        return TxnRecord.from_bytes(found.value) if found is not None else None
