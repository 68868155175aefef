"""What a segment's readers may see of transactions: the last stable offset and the
batches of aborted transactions, as Kafka's ``read_committed`` consumers see them.

A transaction's batches land in a segment's log among other batches, as they arrive;
its fate arrives later as a marker (commit or abort) that ``storage``'s frames carry
after them. Until the marker, nothing at or after the transaction's first batch may
be read: a reader would otherwise either deliver what may yet abort, or skip it and
deliver later messages of the same keys first. So readers stop at the *last stable
offset* (the first offset of the oldest undecided transaction, or the log's end), and
below it skip the batches of transactions that aborted.

``TxnIndex`` follows one segment's log, in log order, as it is written or recovered.
Who calls: the segment's log, before storing a transaction's batch (``check``), for
each stored batch (``batch``) and marker (``marker``), and for each read
(``stable_end``, ``visible``). What it affects: what readers get and
where they wait; and it refuses a batch of a transaction this segment already saw
decided, so that a producer's message sent after its transaction's abort never
appears. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import TransactionNotOpenError


@dataclass(frozen=True)
class Fate:
    """A transaction's fate in one segment: where its first batch is (``None`` when the
    marker came without any), where its marker is, and whether it committed."""

    first: int | None
    marker: int
    committed: bool


class TxnIndex:
    def __init__(self) -> None:
        self._open: dict[str, int] = {}  # undecided transaction → its first batch's offset
        self._fates: dict[str, Fate] = {}

    @property
    def open(self) -> dict[str, int]:
        """Each undecided transaction and the offset of its first batch here."""
        return dict(self._open)

    def fate(self, txn_id: str) -> Fate | None:
        return self._fates.get(txn_id)

    def check(self, txn_id: str) -> None:
        """Refuse a batch of ``txn_id`` before it is stored if its marker is here."""
        fate = self._fates.get(txn_id)
        if fate is not None:
            outcome = "committed" if fate.committed else "aborted"
            raise TransactionNotOpenError(
                f"transaction {txn_id} is {outcome} in this segment (marker at offset "
                f"{fate.marker}): it takes no more messages"
            )

    def batch(self, base_offset: int, txn_id: str | None) -> None:
        """A batch stored at ``base_offset``, of ``txn_id`` or of no transaction (what is
        stored is recorded as it is: ``check`` it before storing)."""
        if txn_id is not None and txn_id not in self._fates:
            self._open.setdefault(txn_id, base_offset)

    def marker(self, offset: int, txn_id: str, committed: bool) -> None:
        """``txn_id``'s marker stored at ``offset`` (the log's end when it was written).
        A second marker of the same transaction (a finisher's retry) changes nothing;
        one that contradicts the first is refused (the log asks before writing one)."""
        fate = self._fates.get(txn_id)
        if fate is not None:
            if fate.committed != committed:
                raise TransactionNotOpenError(
                    f"transaction {txn_id} is already "
                    f"{'committed' if fate.committed else 'aborted'} in this segment"
                )
            return
        self._fates[txn_id] = Fate(self._open.pop(txn_id, None), offset, committed)

    def stable_end(self, end_offset: int) -> int:
        """Where readers stop: the first batch of the oldest undecided transaction, or
        ``end_offset`` when none is undecided."""
        return min(self._open.values(), default=end_offset)

    @property
    def any_decided(self) -> bool:
        """Whether a marker is stored here: only then can an offset be hidden."""
        return bool(self._fates)

    def hidden(self, txn_id: str | None) -> bool:
        """Whether a batch is never delivered, whoever reads: its transaction aborted."""
        fate = None if txn_id is None else self._fates.get(txn_id)
        return fate is not None and not fate.committed

    def visible(self, txn_id: str | None) -> bool:
        """Whether a batch below the stable end is delivered: it belongs to no
        transaction, or to one that committed."""
        if txn_id is None:
            return True
        fate = self._fates.get(txn_id)
        return fate is not None and fate.committed
