"""Replicated segments: the rules that keep an acknowledged entry, without Ray.

A replicated segment is a *leader* and followers, each a copy of the segment's log on
its own node (a *replica*, named by its node). Producers append to the leader, which
streams its log to the followers. The shape is Kafka's (leader epochs, a high
watermark) with BookKeeper's fencing on recovery, and the topic controller's
compare-and-swap on the metadata as the one authority: no consensus among replicas.
Every decision is a pure function here, so it is tested exhaustively without Ray
(``tests/test_replication_rules.py`` runs random crashes, elections and stale leaders
against them); the actors only carry frames and call these.

Terms:

- *epoch*: the segment's leader epoch. Every leader change takes the next one, by
  compare-and-swap on the topic's metadata. Every append and replication frame carries
  its sender's epoch; a replica refuses frames of an epoch below the highest it has
  seen (``admits``): the old leader is *fenced*.
- *end*: a replica's log end offset, the offset its next entry gets.
- *epoch history* (``EpochHistory``, Kafka's leader-epoch cache): where each epoch
  began in a log. A leader records its epoch's start at its end when it takes over; a
  follower adopts the leader's history once its log matches the leader's.
- *divergence* (``divergence``): where a follower's log stops matching its leader's,
  found from the two histories. The follower truncates there before copying: what it
  drops was never committed (an old leader's tail).
- *high watermark* (``high_watermark``): the end of the committed prefix. An offset
  below it is held by ``ack_quorum`` replicas, the leader among them, that adopted the
  leader's current epoch. Producers are acknowledged, and readers served, below it only.

Why a follower counts only once it adopted the current epoch: a new leader's log may
end in entries an older leader wrote and never committed. Counting copies of those
entries alone could "commit" an entry that a later election, choosing a log with a
newer epoch, drops (Raft's figure 8). A follower that adopted the current epoch has a
newer last epoch than any log that never heard of it, so the next election prefers it
(``choose_leader``); the epoch start works as Raft's no-op entry of a new term.

Failover (the controller, when a leader's node is gone):

1. fence at least ``reports_needed`` replicas at the next epoch (each then refuses the
   old leader, and reports its last epoch and end). Any ack quorum of the old epoch
   meets one of them, and the replicas left unfenced are too few for the old leader
   to complete a quorum again;
2. ``choose_leader`` among the reports: the most up-to-date log (newest last epoch,
   then the longest) holds every committed entry;
3. compare-and-swap the metadata to the new epoch and leader (losing means another
   election won: follow it); only then is the chosen replica told to lead;
4. the new leader ``begin``s its epoch at its end; followers truncate to their
   ``divergence`` and copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from runtime.errors import InvalidArgumentError, NotEnoughNodesError, NotEnoughReplicasError

# More copies than this buy no safety a user asks for and multiply every write.
MAX_REPLICATION_FACTOR = 7

# The epoch a replica set is recorded at, before any election. No replica has led an
# epoch, so no follower has copied anything: whatever the segment holds is on the replica
# its placement chose to lead (a segment replicated while it lived had its records there).
FIRST_EPOCH = 1


@dataclass(frozen=True)
class Replication:
    """How many copies of each active segment, and how many must hold an entry before
    it is acknowledged (the leader among them)."""

    factor: int = 1
    ack_quorum: int = 1

    @classmethod
    def of(cls, factor: int, ack_quorum: int | None = None) -> Replication:
        """Checked settings; ``ack_quorum`` defaults to a majority of ``factor``."""
        if isinstance(factor, bool) or not isinstance(factor, int):
            raise InvalidArgumentError(f"replication factor must be an integer, got {factor!r}")
        if not 1 <= factor <= MAX_REPLICATION_FACTOR:
            raise InvalidArgumentError(
                f"replication factor must be 1 to {MAX_REPLICATION_FACTOR}, got {factor}"
            )
        quorum = factor // 2 + 1 if ack_quorum is None else ack_quorum
        if isinstance(quorum, bool) or not isinstance(quorum, int) or not 1 <= quorum <= factor:
            raise InvalidArgumentError(
                f"ackQuorum must be an integer from 1 to the factor ({factor}), got {quorum!r}"
            )
        return cls(factor, quorum)

    @property
    def reports_needed(self) -> int:
        """Replicas an election must fence and hear from: enough to meet every ack
        quorum of the old epoch, so the chosen log holds every committed entry."""
        return self.factor - self.ack_quorum + 1

    def check_nodes(self, nodes: int) -> None:
        """Refuse a factor that the nodes a namespace may place on cannot hold, one
        replica per node."""
        if self.factor > nodes:
            raise NotEnoughNodesError(
                f"replication factor {self.factor} needs {self.factor} nodes, one replica "
                f"each; the namespace's placement allows {nodes}"
            )


@dataclass(frozen=True)
class EpochStart:
    epoch: int
    offset: int


@dataclass(frozen=True)
class EpochHistory:
    """Where each epoch began in one log, oldest first: epochs rise, offsets do not fall.

    Who changes it: a leader (``begin`` when it takes over), a follower (adopting its
    leader's once its log matches, ``truncated`` when it drops a tail). Who reads it:
    ``divergence`` (the leader answers a rejoining follower from its own) and
    ``choose_leader`` (through a replica's report of its last epoch)."""

    starts: tuple[EpochStart, ...] = ()

    @property
    def last_epoch(self) -> int:
        """The newest epoch this log knows (0: none, an unreplicated log)."""
        return self.starts[-1].epoch if self.starts else 0

    def begin(self, epoch: int, offset: int) -> EpochHistory:
        """``epoch`` begins at ``offset`` (a leader's end when it takes over)."""
        if epoch <= self.last_epoch:
            raise ValueError(f"epoch {epoch} does not follow {self.last_epoch}")
        if self.starts and offset < self.starts[-1].offset:
            raise ValueError(f"epoch {epoch} cannot begin at {offset}, before its predecessor")
        return EpochHistory((*self.starts, EpochStart(epoch, offset)))

    def end_of(self, epoch: int, log_end: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch, for a log ending at ``log_end``: the newest epoch
        of this history not after ``epoch``, and where it ends here (the next epoch's
        start, or ``log_end``). ``(0, first start)`` when every epoch here is later."""
        newest = 0
        end = self.starts[0].offset if self.starts else log_end
        for i, start in enumerate(self.starts):
            if start.epoch > epoch:
                break
            newest = start.epoch
            end = self.starts[i + 1].offset if i + 1 < len(self.starts) else log_end
        return newest, min(end, log_end)

    def truncated(self, end: int) -> EpochHistory:
        """The history of this log cut to ``[0, end)``: epochs that began past the cut
        are forgotten; one beginning exactly there is kept (it holds no entry yet, but it
        is what the log has adopted)."""
        return EpochHistory(tuple(s for s in self.starts if s.offset <= end))


def divergence(
    leader: EpochHistory, leader_end: int, follower: EpochHistory, follower_end: int
) -> int:
    """The offset a follower keeps its log up to before copying from its leader.

    Entries of one epoch were all written by that epoch's leader, at the same offsets in
    every copy; so a follower's entries of an epoch the leader also has match the
    leader's up to where that epoch ends in the leader's log, and entries of an epoch the
    leader never had were never committed."""
    history, end = follower, follower_end
    while history.starts:
        epoch = history.last_epoch
        found, found_end = leader.end_of(epoch, leader_end)
        if found == epoch:
            return min(end, found_end)
        # The leader never had this epoch: its entries here go, and the one before decides.
        end = min(end, history.starts[-1].offset)
        history = EpochHistory(history.starts[:-1])
    # What is left was written before any epoch, by the segment's one writer before it was
    # replicated: the same in every copy, up to where the leader's first epoch begins.
    return min(end, leader.end_of(0, leader_end)[1])


def high_watermark(leader_end: int, follower_ends: Iterable[int], ack_quorum: int) -> int:
    """The committed end: the ``ack_quorum``-th largest of the leader's end and its
    followers' matched ends (each follower counted only once its log matches the
    leader's in the current epoch; ``ReplicaProgress`` keeps them). 0 while fewer replicas
    than the quorum hold anything."""
    ends = sorted((leader_end, *(min(end, leader_end) for end in follower_ends)), reverse=True)
    return ends[ack_quorum - 1] if len(ends) >= ack_quorum else 0


@dataclass
class ReplicaProgress:
    """A leader's view of its epoch's replication: its followers' matched ends and the
    high watermark, which never moves back.

    Who calls: the leader's segment, on each follower's answer (``matched``), on each
    append of its own (``appended``), and on a follower removed from the replica set
    (``forget``). What it affects: which producers are acknowledged and how far readers
    may read (``hw``)."""

    epoch: int
    ack_quorum: int
    leader_end: int
    followers: dict[str, int]
    hw: int = 0
    sealed: set[str] = field(default_factory=set)  # followers whose copy is sealed

    @classmethod
    def starting(cls, epoch: int, ack_quorum: int, leader_end: int, hw: int = 0) -> ReplicaProgress:
        """A new leader's progress: no follower matched yet; the committed end it knew
        as a follower (``hw``) stands."""
        return cls(epoch, ack_quorum, leader_end, {}, min(hw, leader_end))

    def appended(self, end: int) -> int:
        self.leader_end = max(self.leader_end, end)
        return self._advance()

    def matched(self, follower: str, epoch: int, end: int, sealed: bool = False) -> int:
        """``follower`` holds the leader's log up to ``end`` and adopted ``epoch``
        (``sealed``: its copy is sealed there): an answer about an older epoch (late, from
        before this leader) counts for nothing."""
        if epoch == self.epoch:
            self.followers[follower] = max(self.followers.get(follower, 0), end)
            if sealed:
                self.sealed.add(follower)
            else:
                self.sealed.discard(follower)
        return self._advance()

    def seal_held(self) -> bool:
        """Whether the ack quorum, the leader among it, holds the sealed log whole: a
        leader elected from any quorum then knows the log is sealed, so no producer's
        append lands after the seal."""
        whole = sum(1 for f in self.sealed if self.followers[f] >= self.leader_end)
        return 1 + whole >= self.ack_quorum

    def forget(self, follower: str) -> None:
        self.followers.pop(follower, None)
        self.sealed.discard(follower)

    def _advance(self) -> int:
        self.hw = max(
            self.hw, high_watermark(self.leader_end, self.followers.values(), self.ack_quorum)
        )
        return self.hw


@dataclass(frozen=True)
class Copy:
    """What a follower does with a copy its leader sent (``follow``): ``accepted`` False
    when the leader is fenced (nothing else changes); else cut its log to ``keep``, and
    store the copy only if it begins there (``store``; otherwise the leader sends again
    from ``keep``)."""

    accepted: bool
    keep: int = 0
    store: bool = False


def follow(
    seen_epoch: int,
    history: EpochHistory,
    end: int,
    leader_epoch: int,
    leader_history: EpochHistory,
    leader_end: int,
    copy_from: int,
) -> Copy:
    """A follower's answer to a leader's copy of its log from ``copy_from``. The follower
    then records ``leader_epoch`` as seen and, once stored, adopts
    ``leader_history.truncated(its new end)``."""
    if not admits(leader_epoch, seen_epoch):
        return Copy(accepted=False)
    keep = divergence(leader_history, leader_end, history, end)
    return Copy(accepted=True, keep=keep, store=copy_from == keep)


# What one shipment carries at most: a follower far behind catches up in steps this size.
DEFAULT_SHIPMENT_BYTES = 4 << 20


@dataclass(frozen=True)
class Fetch:
    """A follower's ask of its leader (``storage.replica_log``): who it is, the newest
    epoch it saw, the epoch its log adopted (its history's last) and its end, where the
    shipment should begin; the leader may hold it up to ``wait_s`` for new entries. The
    version of the cursors it holds tells the leader whether to ship them again."""

    replica: str
    seen_epoch: int
    adopted_epoch: int
    offset: int
    max_bytes: int = DEFAULT_SHIPMENT_BYTES
    wait_s: float = 0.0
    cursor_version: int = 0  # of the subscriptions' cursors the follower holds
    sealed: bool = False  # the follower's log is sealed at ``offset``


@dataclass(frozen=True)
class Shipment:
    """A leader's answer: its epoch, history, start, end and high watermark, and its
    stored frames from ``offset`` (the fetch's; none while the follower must first cut
    its tail or begin at ``start``)."""

    epoch: int
    history: EpochHistory
    start: int
    end: int
    high_watermark: int
    offset: int
    frames: bytes | memoryview
    # The leader's subscription cursors when the follower's version differs (else empty)
    cursor_version: int = 0
    cursors: bytes | memoryview = b""
    sealed: bool = False  # the leader's log is sealed at ``end``


@dataclass(frozen=True)
class ReplicaReport:
    """What a fenced replica tells an election: its log's newest epoch, its end, and
    whether its log is sealed there."""

    replica: str
    last_epoch: int
    end: int
    sealed: bool = False


def admits(frame_epoch: int, seen_epoch: int) -> bool:
    """Whether a replica that has seen ``seen_epoch`` accepts a frame (an append, a
    replication frame) of ``frame_epoch``: never one from before a newer leader."""
    return frame_epoch >= seen_epoch


def choose_leader(
    reports: Iterable[ReplicaReport],
    replication: Replication,
    prefer: str | None = None,
    avoid: frozenset[str] = frozenset(),
) -> ReplicaReport:
    """The replica to lead the next epoch: among at least ``reports_needed`` fenced
    replicas, the most up-to-date log (newest last epoch, then longest, then sealed: a
    seal its leader waited for is held by an ack quorum, which the reports meet). A tie
    goes first to a replica not in ``avoid`` (those on the controller's own node: a node lost with
    both the controller and a leader leaves that segment without a leader until Ray
    restarts the controller elsewhere), then to ``prefer`` (the leader the record names:
    a segment's first election keeps the leader its placement chose, and a leader that
    restarted keeps leading when nobody holds more), then to the name, so every
    controller that sees the same reports chooses alike. Only ties: the most up-to-date
    log always wins, wherever it is."""
    heard = {report.replica: report for report in reports}
    if len(heard) < replication.reports_needed:
        raise NotEnoughReplicasError(
            f"an election needs {replication.reports_needed} of {replication.factor} replicas "
            f"(ackQuorum {replication.ack_quorum}); {len(heard)} answered"
        )
    return max(
        heard.values(),
        key=lambda r: (
            r.last_epoch,
            r.end,
            r.sealed,
            r.replica not in avoid,
            r.replica == prefer,
            r.replica,
        ),
    )
