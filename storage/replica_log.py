"""One replica of a segment's log, as a leader or a follower: the rules of
``runtime.replication`` applied to a real ``SegmentLog`` and its ``replica.json``.

Followers pull, as Kafka's do: a follower asks its leader for what follows its end
(a ``Fetch``), and the leader answers with its frames from there, its epoch history,
its end and its high watermark (a ``Shipment``). The ask itself is the follower's
progress report: a follower that adopted the leader's epoch holds the leader's log up
to where it asks from, so the leader counts it there (``ReplicaProgress.matched``). A
follower whose log diverged learns it from the shipment's history
(``runtime.replication.follow``), cuts its tail and asks again from there; a leader
never needs a follower's history.

Fencing runs both ways. A follower refuses a shipment from an epoch older than the
newest it saw, and a leader that is asked by a follower that saw a newer epoch learns
it is stale (``StaleEpochError``) and must stop acknowledging. An election
(``fence``) raises a replica's seen epoch durably before it answers, so a restart
cannot un-fence it.

These are plain objects with no Ray and no sockets: the segment actor carries fetches
and shipments over its data plane and calls these, and the tests drive them directly
with real files.
"""

from __future__ import annotations

from dataclasses import replace

from runtime.errors import InvalidArgumentError, StaleEpochError, UnavailableError
from runtime.replication import (
    DEFAULT_SHIPMENT_BYTES,
    EpochHistory,
    Fetch,
    ReplicaProgress,
    ReplicaReport,
    Replication,
    Shipment,
    follow,
)
from storage.replica_state import ReplicaState, ReplicaStateFile
from storage.segment_log import SegmentLog


class LeaderReplica:
    """A segment's log as its epoch's leader.

    Who calls: the leader segment, on each of its own appends (``appended``) and on
    each follower's fetch (``ship``). What it affects: the high watermark (``hw``),
    below which producers are acknowledged and readers served."""

    def __init__(
        self,
        name: str,
        log: SegmentLog,
        state_file: ReplicaStateFile,
        replication: Replication,
        epoch: int,
    ) -> None:
        """Take the lead of ``epoch``, which begins at the log's end, durably, before
        anything is shipped or acknowledged. Refused (``StaleEpochError``) when this
        replica saw a newer epoch, or already holds this one: a replica that led an epoch
        and restarted may have lost an unflushed tail that followers copied, and writing
        other entries at those offsets under the same epoch would make the copies look
        alike (``divergence``) where they differ. Every lead is a new epoch."""
        state = state_file.load()
        if epoch < state.seen_epoch or epoch <= state.history.last_epoch:
            raise StaleEpochError(
                f"segment replica {name}: cannot lead epoch {epoch}; it saw epoch "
                f"{state.seen_epoch} and its log holds epoch {state.history.last_epoch}"
            )
        history = state.history.begin(epoch, log.end_offset)
        self._state = ReplicaState(epoch, history, min(state.high_watermark, log.end_offset))
        state_file.save(self._state)
        self.name, self._log, self._state_file, self.epoch = name, log, state_file, epoch
        self._progress = ReplicaProgress.starting(
            epoch, replication.ack_quorum, log.end_offset, self._state.high_watermark
        )

    @property
    def hw(self) -> int:
        """The committed end: every offset below it is held by the ack quorum."""
        return self._progress.hw

    @property
    def ack_quorum(self) -> int:
        return self._progress.ack_quorum

    @property
    def followers(self) -> dict[str, int]:
        """Each follower counted in this epoch, and the end it is known to hold."""
        return dict(self._progress.followers)

    @property
    def sealed_by(self) -> set[str]:
        """The followers whose copy is sealed."""
        return set(self._progress.sealed)

    @property
    def seal_held(self) -> bool:
        """Whether the ack quorum holds this log sealed (``ReplicaProgress.seal_held``)."""
        return self._log.terminated and self._progress.seal_held()

    def appended(self) -> int:
        """The leader's log grew: the new high watermark (grown too if the quorum is the
        leader alone)."""
        return self._progress.appended(self._log.end_offset)

    def ship(self, fetch: Fetch) -> Shipment:
        """Answer a follower's fetch, counting its progress first."""
        if fetch.seen_epoch > self.epoch:
            raise StaleEpochError(
                f"segment replica {self.name}: follower {fetch.replica} saw "
                f"epoch {fetch.seen_epoch}, newer than this leader's {self.epoch}; this leader "
                "is fenced"
            )
        log, history = self._log, self._state.history
        end = log.end_offset
        if fetch.offset > end and fetch.adopted_epoch == self.epoch:
            raise InvalidArgumentError(
                f"follower {fetch.replica} claims offset {fetch.offset} of epoch {self.epoch}, "
                f"past the leader's end {end}"
            )
        if fetch.adopted_epoch == self.epoch:
            self._progress.matched(fetch.replica, self.epoch, fetch.offset, fetch.sealed)
        frames = b""
        if self._continues(fetch, end):
            frames = log.frames_from(fetch.offset, fetch.max_bytes)
        return Shipment(
            self.epoch, history, log.start_offset, end, self.hw, fetch.offset, frames,
            sealed=log.terminated,
        )  # fmt: skip

    def forget(self, replica: str) -> None:
        """``replica`` left the replica set: it no longer counts toward the quorum."""
        self._progress.forget(replica)

    def save(self) -> None:
        """Record the high watermark (a restarted replica serves below it at once)."""
        if self._state.high_watermark != self.hw:
            self._state = replace(self._state, high_watermark=self.hw)
            self._state_file.save(self._state)

    def _continues(self, fetch: Fetch, end: int) -> bool:
        """Whether frames from the fetch's offset are what the follower stores next: its
        adopted epoch ends here at or after that offset, which begins a batch, and a
        follower at this log's start or later."""
        if not self._log.start_offset <= fetch.offset < end:
            return False
        epoch, epoch_end = self._state.history.end_of(fetch.adopted_epoch, end)
        return epoch == fetch.adopted_epoch and fetch.offset <= epoch_end


class FollowerReplica:
    """A segment's log as a follower of its leader.

    Who calls: the follower segment's fetch loop (``fetch``, then ``receive`` with the
    answer) and the controller's election (``fence``). What it affects: this log and its
    ``replica.json``; the high watermark it serves readers below."""

    def __init__(self, name: str, log: SegmentLog, state_file: ReplicaStateFile) -> None:
        self.name, self._log, self._state_file = name, log, state_file
        state = state_file.load()
        self._state = replace(state, high_watermark=min(state.high_watermark, log.end_offset))

    @property
    def state(self) -> ReplicaState:
        return self._state

    @property
    def hw(self) -> int:
        return self._state.high_watermark

    def fetch(self, max_bytes: int = DEFAULT_SHIPMENT_BYTES) -> Fetch:
        state = self._state
        log = self._log
        return Fetch(
            self.name, state.seen_epoch, state.history.last_epoch, log.end_offset, max_bytes,
            sealed=log.terminated,
        )  # fmt: skip

    def receive(self, shipment: Shipment) -> int:
        """Store what a leader shipped, after cutting a tail it never had; returns the new
        end. ``StaleEpochError`` for a leader older than an epoch this replica saw: it
        changes nothing."""
        log, state = self._log, self._state
        copy = follow(
            state.seen_epoch, state.history, log.end_offset, shipment.epoch,
            shipment.history, shipment.end, shipment.offset,
        )  # fmt: skip
        if not copy.accepted:
            raise StaleEpochError(
                f"segment replica {self.name}: a shipment of epoch {shipment.epoch} "
                f"refused, this replica saw epoch {state.seen_epoch}"
            )
        history = state.history
        if copy.keep < log.end_offset:
            log.truncate_tail(copy.keep)
            history = history.truncated(copy.keep)
        if log.end_offset < shipment.start:
            history = self._begin_at(shipment)
        elif copy.store:
            if shipment.frames:
                log.append_frames(shipment.frames)
            history = shipment.history.truncated(log.end_offset)
        if shipment.sealed and log.end_offset == shipment.end and not log.terminated:
            log.terminate()  # all of a sealed leader's log is here: sealed alike
        high_watermark = max(state.high_watermark, min(shipment.high_watermark, log.end_offset))
        self._keep(ReplicaState(max(state.seen_epoch, shipment.epoch), history, high_watermark))
        return log.end_offset

    def fence(self, epoch: int) -> ReplicaReport:
        """An election at ``epoch``: refuse every older leader from now on, durably, then
        report this log's newest epoch and end (``runtime.replication.choose_leader``)."""
        if epoch > self._state.seen_epoch:
            self._keep(replace(self._state, seen_epoch=epoch))
        return self.report()

    def report(self) -> ReplicaReport:
        log = self._log
        return ReplicaReport(
            self.name, self._state.history.last_epoch, log.end_offset, log.terminated
        )

    def _begin_at(self, shipment: Shipment) -> EpochHistory:
        """An empty follower of a leader whose log begins past 0 begins where it does, with
        the epochs the leader's log held there. One that holds records ending before that
        start shares nothing with the leader's log any more."""
        log = self._log
        if log.end_offset != log.start_offset:
            raise UnavailableError(
                f"segment replica {self.name} ends at {log.end_offset}, before its leader's "
                f"start {shipment.start}: it must be rebuilt from the leader"
            )
        log.begin_at(shipment.start)
        return shipment.history.truncated(shipment.start)

    def save(self) -> None:
        """Record the high watermark too (when the follower stops)."""
        self._state_file.save(self._state)

    def _keep(self, state: ReplicaState) -> None:
        """Save a new epoch or history before it is acted on. A high watermark alone is
        kept in memory (``save`` records it): a file write per shipment would pace the
        copies by the disk's flushes, and one that is older after a restart is safe (a
        replica serves less, never more, until its leader says again)."""
        if (state.seen_epoch, state.history) != (self._state.seen_epoch, self._state.history):
            self._state_file.save(state)
        self._state = state
