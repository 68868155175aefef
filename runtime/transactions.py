"""A transaction's life, decided in one record: which segments it wrote, which
acknowledgements wait on it, and whether it commits or aborts.

Why one record: a transaction spans topics and segments, each with its own actors, and
any of them, the client included, may crash mid-way. The record (kept by
``storage.transactions`` in the metadata store, as PIP-473 keeps Pulsar's) is the one
authority, changed only by compare-and-swap and only through the named updates below
(``Join``, ``Acknowledge``, ``Commit``, ``Abort``, ``Expire``, ``Finish``), as
Pravega's reader group state is. The decision is the swap that moves the record from
``OPEN`` to ``COMMITTING`` or ``ABORTING``; whoever reads a decided record afterwards
(the client that decided, or a sweeper after its crash) finishes it the same way:
a commit or abort marker to every segment it wrote, and for a commit its
acknowledgements applied, then ``Finish``. Both are idempotent, so finishing twice, or
concurrently, is harmless.

The rules, as Kafka's transaction coordinator keeps them:

- a segment is *joined* (recorded here) before the first message of the transaction
  is sent to it, so whoever finishes the transaction reaches every segment that may
  hold its messages;
- an open transaction past its deadline can only be aborted (``Expire``);
- an *owner* (Kafka's ``transactional.id``) has at most one open transaction: starting
  another fences the one before (``Abort`` with ``FENCED``), so a producer's stale
  transaction from before its restart can no longer commit. A fenced transaction that
  had already decided to commit stays committed, as Kafka completes a prepared commit.

Pure: no I/O, no clock (callers pass ``now_ms``), so every rule is tested alone.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from runtime.errors import InvalidArgumentError, TransactionNotOpenError, UnauthorizedError

MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 900.0  # Kafka's transaction.max.timeout.ms default: 15 minutes
DEFAULT_TIMEOUT_S = 60.0
# How long a decided transaction is left to the client that decided it before a
# sweeper finishes it: its segments' readers wait for its markers meanwhile.
FINISH_GRACE_MS = 5_000
# How long a finished transaction's record is kept, so that a commit or abort sent again
# after its answer was lost is answered with the outcome rather than "no transaction".
FINISHED_KEPT_MS = 600_000

TIMED_OUT = "timed out"
FENCED = "fenced: its owner started a newer transaction"


class TxnStatus(enum.Enum):
    """``OPEN`` takes messages and acknowledgements; ``COMMITTING`` and ``ABORTING`` are
    decided and being finished; ``COMMITTED`` and ``ABORTED`` are finished."""

    OPEN = "open"
    COMMITTING = "committing"
    ABORTING = "aborting"
    COMMITTED = "committed"
    ABORTED = "aborted"

    @property
    def decided(self) -> bool:
        return self is not TxnStatus.OPEN

    @property
    def commits(self) -> bool:
        return self in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)

    @property
    def finished(self) -> bool:
        return self in (TxnStatus.COMMITTED, TxnStatus.ABORTED)


@dataclass(frozen=True, order=True)
class SegmentRef:
    """A segment a transaction wrote, by its name (``segment://…``: its topic, id and
    range, all its finisher needs to reach it)."""

    segment: str


@dataclass(frozen=True, order=True)
class PendingAck:
    """An acknowledgement applied when the transaction commits: ``offset`` of
    ``segment`` (its name) for ``subscription``, or everything up to it with
    ``cumulative``."""

    segment: str
    subscription: str
    offset: int
    cumulative: bool = False


@dataclass(frozen=True)
class TxnRecord:
    """One transaction as its record holds it."""

    txn_id: str
    status: TxnStatus
    started_ms: int
    deadline_ms: int
    owner: str | None = None
    owner_epoch: int = 0
    segments: frozenset[SegmentRef] = field(default_factory=frozenset)
    acks: tuple[PendingAck, ...] = ()
    reason: str | None = None  # why it aborted, when not asked to
    decided_ms: int | None = None  # when it left OPEN
    principal: str | None = None  # who began it (None: authentication was off)

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {
            "txnId": self.txn_id,
            "status": self.status.value,
            "startedMs": self.started_ms,
            "deadlineMs": self.deadline_ms,
            "owner": self.owner,
            "ownerEpoch": self.owner_epoch,
            "segments": [s.segment for s in sorted(self.segments)],
            "acks": [[a.segment, a.subscription, a.offset, a.cumulative] for a in self.acks],
            "reason": self.reason,
            "decidedMs": self.decided_ms,
            "principal": self.principal,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> TxnRecord:
        body = json.loads(raw)
        return cls(
            txn_id=body["txnId"],
            status=TxnStatus(body["status"]),
            started_ms=body["startedMs"],
            deadline_ms=body["deadlineMs"],
            owner=body["owner"],
            owner_epoch=body["ownerEpoch"],
            segments=frozenset(SegmentRef(s) for s in body["segments"]),
            acks=tuple(PendingAck(s, sub, o, c) for s, sub, o, c in body["acks"]),
            reason=body["reason"],
            decided_ms=body["decidedMs"],
            principal=body.get("principal"),
        )


def begin(
    txn_id: str,
    now_ms: int,
    timeout_s: float,
    owner: str | None = None,
    owner_epoch: int = 0,
    principal: str | None = None,
) -> TxnRecord:
    """A new open transaction, or ``InvalidArgumentError`` for a time-out out of bounds."""
    if not MIN_TIMEOUT_S <= timeout_s <= MAX_TIMEOUT_S:
        raise InvalidArgumentError(
            f"a transaction's timeout_s must be between {MIN_TIMEOUT_S:g} and "
            f"{MAX_TIMEOUT_S:g} seconds, not {timeout_s:g}"
        )
    deadline = now_ms + round(timeout_s * 1000)
    return TxnRecord(
        txn_id, TxnStatus.OPEN, now_ms, deadline, owner, owner_epoch, principal=principal
    )


def check_holder(record: TxnRecord, principal: str | None, doing: str) -> None:
    """Refuse ``doing`` to a transaction begun by another principal, as Pulsar's
    coordinator checks a transaction's owner before ending it: an id that leaked (in a
    log, a listing) must not let another tenant commit or abort someone's work.
    ``principal`` None: the system, an operator with admin on every namespace, or a
    caller with authentication off; a record begun with it off is anyone's."""
    if record.principal is None or principal is None or principal == record.principal:
        return
    raise UnauthorizedError(
        f"principal {principal!r} may not {doing} transaction {record.txn_id}: "
        "only the principal that began it, or an admin of every namespace"
    )


class Update(Protocol):
    """A named change of a record. ``apply`` returns the record it becomes (the same
    record when there is nothing to change: a retried update is harmless) or raises
    ``TransactionNotOpenError`` saying why it cannot apply."""

    def apply(self, record: TxnRecord, now_ms: int) -> TxnRecord: ...


def _open(record: TxnRecord, now_ms: int, doing: str) -> None:
    """Refuse ``doing`` unless the transaction is open and within its time-out."""
    if record.status is not TxnStatus.OPEN:
        raise TransactionNotOpenError(
            f"transaction {record.txn_id} is {record.status.value}"
            + (f" ({record.reason})" if record.reason else "")
            + f": it cannot {doing}"
        )
    if now_ms >= record.deadline_ms:
        raise TransactionNotOpenError(
            f"transaction {record.txn_id} timed out "
            f"{(now_ms - record.deadline_ms) / 1000:.1f} s ago: it cannot {doing}; it is aborted"
        )


@dataclass(frozen=True)
class Join:
    """Segments about to receive the transaction's messages. Who calls: a producer,
    before its first message of the transaction to each segment."""

    segments: frozenset[SegmentRef]

    def apply(self, record: TxnRecord, now_ms: int) -> TxnRecord:
        _open(record, now_ms, "take messages")
        if self.segments <= record.segments:
            return record
        return replace(record, segments=record.segments | self.segments)


@dataclass(frozen=True)
class Acknowledge:
    """Acknowledgements that apply only if the transaction commits. Who calls: a
    consumer's ``acknowledge(msg, txn=…)``."""

    acks: tuple[PendingAck, ...]

    def apply(self, record: TxnRecord, now_ms: int) -> TxnRecord:
        _open(record, now_ms, "take acknowledgements")
        new = tuple(ack for ack in self.acks if ack not in record.acks)
        return replace(record, acks=record.acks + new) if new else record


@dataclass(frozen=True)
class Commit:
    """Decide to commit. Who calls: ``txn.commit()``. Asked again (a retry after a lost
    answer), it changes nothing."""

    def apply(self, record: TxnRecord, now_ms: int) -> TxnRecord:
        if record.status.commits:
            return record
        _open(record, now_ms, "commit")
        return replace(record, status=TxnStatus.COMMITTING, decided_ms=now_ms)


@dataclass(frozen=True)
class Abort:
    """Decide to abort: asked by ``txn.abort()`` (no ``reason``), or a fence (``FENCED``).
    A transaction that already decided to commit cannot be aborted by its client; a
    fence leaves it to commit, as its decision stands."""

    reason: str | None = None

    def apply(self, record: TxnRecord, now_ms: int) -> TxnRecord:
        if record.status in (TxnStatus.ABORTING, TxnStatus.ABORTED):
            return record
        if record.status.commits:
            if self.reason == FENCED:
                return record
            raise TransactionNotOpenError(
                f"transaction {record.txn_id} is {record.status.value}: it cannot abort"
            )
        return replace(record, status=TxnStatus.ABORTING, reason=self.reason, decided_ms=now_ms)


@dataclass(frozen=True)
class Expire:
    """Abort an open transaction past its deadline; any other record is left as it is.
    Who calls: the sweeper, and a client whose update was refused as timed out."""

    def apply(self, record: TxnRecord, now_ms: int) -> TxnRecord:
        if record.status is TxnStatus.OPEN and now_ms >= record.deadline_ms:
            return replace(record, status=TxnStatus.ABORTING, reason=TIMED_OUT, decided_ms=now_ms)
        return record


@dataclass(frozen=True)
class Finish:
    """The markers are written and, for a commit, the acknowledgements applied. Who
    calls: whoever finished a decided transaction."""

    def apply(self, record: TxnRecord, now_ms: int) -> TxnRecord:  # noqa: ARG002 - always allowed
        if record.status is TxnStatus.COMMITTING:
            return replace(record, status=TxnStatus.COMMITTED)
        if record.status is TxnStatus.ABORTING:
            return replace(record, status=TxnStatus.ABORTED)
        if record.status is TxnStatus.OPEN:
            raise TransactionNotOpenError(
                f"transaction {record.txn_id} is open: it is finished only once decided"
            )
        return record


def forgettable(record: TxnRecord, now_ms: int, kept_ms: int = FINISHED_KEPT_MS) -> bool:
    """Whether a sweeper may remove ``record``: finished ``kept_ms`` after its decision."""
    decided = record.decided_ms if record.decided_ms is not None else record.started_ms
    return record.status.finished and now_ms >= decided + kept_ms


def needs_sweep(record: TxnRecord, now_ms: int, grace_ms: int = FINISH_GRACE_MS) -> bool:
    """Whether a sweeper should act on ``record``: open past its deadline, or decided
    ``grace_ms`` ago and not finished (its finisher crashed, or is very slow: finishing
    twice is harmless). Until then, readers of its segments wait at its first message."""
    if record.status is TxnStatus.OPEN:
        return now_ms >= record.deadline_ms
    if record.status.finished:
        return False
    return record.decided_ms is None or now_ms >= record.decided_ms + grace_ms


def ack_calls(acks: tuple[PendingAck, ...]) -> list[tuple[str, str, bool, int | list[int]]]:
    """A commit's acknowledgements as one call per segment, subscription and kind:
    ``(segment, subscription, cumulative, offset)`` with the highest offset of the
    cumulative ones (it covers the rest), ``(…, False, offsets)`` with the individual
    ones. Acknowledging is idempotent and commutes, so their order does not matter."""
    cumulative: dict[tuple[str, str], int] = {}
    single: dict[tuple[str, str], set[int]] = {}
    for ack in acks:
        where = (ack.segment, ack.subscription)
        if ack.cumulative:
            cumulative[where] = max(cumulative.get(where, ack.offset), ack.offset)
        else:
            single.setdefault(where, set()).add(ack.offset)
    calls: list[tuple[str, str, bool, int | list[int]]] = [
        (segment, sub, True, offset) for (segment, sub), offset in sorted(cumulative.items())
    ]
    calls += [
        (segment, sub, False, sorted(offsets)) for (segment, sub), offsets in sorted(single.items())
    ]
    return calls
