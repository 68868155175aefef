"""Replicas of a segment's log on real files (``storage.replica_log``): followers pull
from their leader, the leader counts them and moves its high watermark, an election
fences the old leader, and a follower that diverged cuts its tail and copies again."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from runtime.batch import make_batch
from runtime.errors import NotEnoughReplicasError, StaleEpochError, UnavailableError
from runtime.replication import (
    Fetch,
    ReplicaReport,
    Replication,
    choose_leader,
)
from storage.durability import Durability
from storage.replica_log import FollowerReplica, LeaderReplica
from storage.replica_state import ReplicaStateFile
from storage.segment_log import SegmentLog

FAST = Durability("none")


class Replicas:
    """Replicas ``r0``... of one segment, each a directory of its own, ``r0`` leading
    epoch 1. Every replica's log and state are opened afresh by ``restart``."""

    def __init__(self, root: Path, replication: Replication) -> None:
        self.root, self.replication = root, replication
        self.names = [f"r{i}" for i in range(replication.factor)]
        self.logs = {name: self._open(name) for name in self.names}
        self.epoch = 1
        self.leader_name = "r0"
        self.leader = self._lead("r0", 1)
        self.followers = {name: self._follow(name) for name in self.names[1:]}
        self.sequence = 0

    def _open(self, name: str) -> SegmentLog:
        return SegmentLog(self.root / name, durability=FAST, max_chunk_bytes=1500)

    def _state(self, name: str) -> ReplicaStateFile:
        return ReplicaStateFile(self.root / name, FAST)

    def _lead(self, name: str, epoch: int) -> LeaderReplica:
        return LeaderReplica(name, self.logs[name], self._state(name), self.replication, epoch)

    def _follow(self, name: str) -> FollowerReplica:
        return FollowerReplica(name, self.logs[name], self._state(name))

    def append(self, count: int = 1, leader: LeaderReplica | None = None) -> int:
        """``count`` batches of two records on the leader (or a stale ``leader``); the
        high watermark after them."""
        leader = leader or self.leader
        log = self.logs[leader.name]
        for _ in range(count):
            values = [f"{leader.epoch}:{self.sequence}:{i}".encode() for i in range(2)]
            log.append(make_batch(values), producer_id="p", sequence=self.sequence)
            self.sequence += 1
        return leader.appended()

    def pull(self, name: str, leader: LeaderReplica | None = None, max_bytes: int = 600) -> int:
        """One fetch of follower ``name`` and its storing; its end after it."""
        follower = self.followers[name]
        return follower.receive((leader or self.leader).ship(follower.fetch(max_bytes)))

    def catch_up(self, *names: str) -> int:
        """Fetch until every named follower holds the leader's log and was counted there."""
        for _ in range(100):
            for name in names:
                self.pull(name)
            counted = self.leader.followers
            if all(counted.get(name) == self.logs[self.leader_name].end_offset for name in names):
                return self.leader.hw
        raise AssertionError(f"{names} never caught up with {self.leader_name}")

    def elect(self, reporters: list[str]) -> str:
        """Fence ``reporters`` at the next epoch, choose, and let the chosen lead; the old
        leader's object is left as it is (a stale leader that does not know yet)."""
        epoch = self.epoch + 1
        reports = [self._fenced(name, epoch) for name in reporters]
        chosen = choose_leader(reports, self.replication).replica
        self.epoch = epoch
        self.followers = {name: self._follow(name) for name in self.names if name != chosen}
        self.leader_name, self.leader = chosen, self._lead(chosen, epoch)
        return chosen

    def _fenced(self, name: str, epoch: int) -> ReplicaReport:
        follower = self.followers.get(name) or self._follow(name)
        return follower.fence(epoch)

    def restart(self, name: str) -> None:
        """The replica's process restarts: its log and state are read from its files."""
        self.logs[name].close()
        self.logs[name] = self._open(name)
        if name in self.followers:
            self.followers[name] = self._follow(name)

    def stored(self, name: str) -> list[tuple]:
        log = self.logs[name]
        batches = log.read(log.start_offset, 1_000_000) if log.end_offset > log.start_offset else []
        return [
            (b.base_offset, b.publish_time_ms, b.producer_id, b.sequence, b.records.to_pylist())
            for b in batches
        ]


@pytest.fixture
def three(tmp_path: Path) -> Replicas:
    return Replicas(tmp_path, Replication.of(3, 2))


def test_a_write_commits_once_the_quorum_holds_it_and_followers_store_it_verbatim(
    three: Replicas,
) -> None:
    assert three.append(3) == 0  # the leader alone is not a quorum of 2
    three.pull("r1")  # shipped, not yet counted: the next fetch says it was stored
    assert three.leader.hw == 0
    assert three.catch_up("r1") == three.logs["r0"].end_offset == 6
    assert three.catch_up("r2") == 6
    assert three.stored("r1") == three.stored("r2") == three.stored("r0")
    assert three.followers["r1"].hw == 6  # learned from the shipments
    # A producer's retry that reaches a follower after a failover is a duplicate there too
    retry = three.logs["r2"].append(make_batch([b"again"]), producer_id="p", sequence=1)
    assert retry.duplicate and retry.base_offset == 2


def test_factor_one_commits_what_the_leader_stores(tmp_path: Path) -> None:
    one = Replicas(tmp_path, Replication.of(1))
    assert one.append(2) == 4


def test_a_follower_that_restarts_keeps_its_epoch_history_and_high_watermark(
    three: Replicas,
) -> None:
    three.append(2)
    three.catch_up("r1", "r2")
    three.append(1)  # r1 does not hear of it before it restarts
    before = three.followers["r1"].state
    three.followers["r1"].save()  # as its segment does when it stops
    three.restart("r1")
    assert three.followers["r1"].state == before
    assert three.followers["r1"].hw == 4
    assert three.catch_up("r1") == 6
    # A crash saves nothing more: the epoch and history stay, the watermark may be older
    three.append(1)
    three.catch_up("r1")
    three.restart("r1")
    after = three.followers["r1"].state
    assert (after.seen_epoch, after.history) == (before.seen_epoch, before.history)
    assert after.high_watermark == 4
    assert three.catch_up("r1") == 8 and three.followers["r1"].hw == 8


def test_an_election_fences_the_old_leader_and_the_new_one_cuts_its_uncommitted_tail(
    three: Replicas,
) -> None:
    three.append(2)
    three.catch_up("r1", "r2")
    old = three.leader
    three.append(3)  # on r0 only: never committed
    assert old.hw == 4
    assert three.elect(["r1", "r2"]) == "r2"  # logs alike: the name decides
    three.append(1)  # epoch 2's first batch, at offset 4
    fenced = three.followers["r1"]
    with pytest.raises(StaleEpochError, match="fenced"):
        old.ship(fenced.fetch())  # a fenced follower tells the old leader
    # A shipment the old leader made before it knew is refused by a fenced follower
    stale = old.ship(Fetch("r1", 1, 1, 4))
    with pytest.raises(StaleEpochError, match="refused"):
        fenced.receive(stale)
    assert three.catch_up("r1") == 6
    # r0 comes back as a follower: its tail of epoch 1 past offset 4 goes, epoch 2's comes
    three.followers["r0"] = FollowerReplica("r0", three.logs["r0"], three._state("r0"))
    three.catch_up("r0")
    assert three.stored("r0") == three.stored("r1") == three.stored("r2")
    assert [b[3] for b in three.stored("r0")] == [0, 1, 5]  # the producer's sequences
    assert old.hw == 4  # it acknowledged nothing after the election


def test_followers_seal_with_their_leader_once_they_hold_all_of_it(three: Replicas) -> None:
    three.append(3)
    three.logs["r0"].terminate()  # a split or merge sealed the segment on its leader
    three.pull("r1", max_bytes=1)  # one batch of three: not sealed yet
    assert not three.logs["r1"].terminated
    three.catch_up("r1", "r2")
    for name in ("r1", "r2"):
        log = three.logs[name]
        assert log.terminated and log.end_offset == three.logs["r0"].end_offset == 6
    three.restart("r1")
    assert three.logs["r1"].terminated and three.pull("r1") == 6  # sealed stays sealed


def test_a_seal_is_held_once_the_quorum_reports_it_and_an_election_chooses_a_sealed_copy(
    three: Replicas,
) -> None:
    three.append(3)
    three.catch_up("r1", "r2")  # both hold the whole log, unsealed
    three.logs["r0"].terminate()
    assert not three.leader.seal_held  # the leader alone is less than the quorum of 2
    three.pull("r1")  # r1 stores the seal; its next fetch says so
    assert three.logs["r1"].terminated and not three.leader.seal_held
    three.pull("r1")
    assert three.leader.seal_held and three.leader.sealed_by == {"r1"}
    # The leader is lost: an election heard by r1 (sealed) and r2 (the same end, unsealed)
    # makes the sealed copy lead, whatever the names' order says.
    assert three.elect(["r2", "r1"]) == "r1"


def test_a_seal_counts_only_for_a_follower_holding_what_the_leader_wrote_after_it(
    three: Replicas,
) -> None:
    three.append(2)
    three.logs["r0"].terminate()
    three.catch_up("r1")
    three.pull("r1")
    assert three.leader.seal_held
    three.logs["r0"].mark("t1", committed=False)  # a sealed log takes a marker
    three.leader.appended()
    assert not three.leader.seal_held  # r1's sealed copy lacks the marker
    three.catch_up("r1")
    assert three.leader.seal_held


def test_a_replica_never_leads_an_epoch_twice(three: Replicas) -> None:
    three.append(1)
    three.restart("r0")
    with pytest.raises(StaleEpochError, match="cannot lead epoch 1"):
        LeaderReplica("r0", three.logs["r0"], three._state("r0"), three.replication, 1)
    # An election that fenced r0 at epoch 3 leaves it unable to lead epoch 2
    FollowerReplica("r0", three.logs["r0"], three._state("r0")).fence(3)
    with pytest.raises(StaleEpochError, match="saw epoch 3"):
        LeaderReplica("r0", three.logs["r0"], three._state("r0"), three.replication, 2)


def test_an_election_needs_enough_fenced_replicas(three: Replicas) -> None:
    with pytest.raises(NotEnoughReplicasError, match="needs 2 of 3"):
        three.elect(["r1"])


def test_a_new_follower_of_a_log_that_held_data_before_it_was_replicated(
    tmp_path: Path,
) -> None:
    """Records written before any epoch (a segment replicated only later) are copied and
    kept; a follower that stopped part-way resumes where it stopped."""
    log = SegmentLog(tmp_path / "r0", durability=FAST, max_chunk_bytes=1500)
    for sequence in range(4):
        log.append(make_batch([b"old"] * 3), producer_id="before", sequence=sequence)
    log.close()
    replicas = Replicas(tmp_path, Replication.of(2, 2))  # epoch 1 begins at 12
    assert replicas.append(1) == 0
    replicas.pull("r1", max_bytes=1)  # one batch: r1 holds offsets 0-2, of no epoch yet
    assert replicas.followers["r1"].state.history.last_epoch == 0
    replicas.restart("r1")
    assert replicas.catch_up("r1") == 14
    assert replicas.stored("r1") == replicas.stored("r0")


def test_a_new_follower_begins_at_the_leaders_start_after_retention(tmp_path: Path) -> None:
    replicas = Replicas(tmp_path, Replication.of(2, 2))
    replicas.append(40)  # many chunks of 1500 bytes
    leader_log = replicas.logs["r0"]
    assert leader_log.truncate_head(40) > 0
    start = leader_log.start_offset
    assert replicas.catch_up("r1") == 80
    assert replicas.logs["r1"].start_offset == start
    assert replicas.stored("r1") == replicas.stored("r0")


def test_a_follower_that_ends_before_its_leaders_start_must_be_rebuilt(tmp_path: Path) -> None:
    replicas = Replicas(tmp_path, Replication.of(2, 2))
    replicas.append(1)
    replicas.catch_up("r1")
    replicas.append(40)
    assert replicas.logs["r0"].truncate_head(60) > 0
    with pytest.raises(UnavailableError, match="must be rebuilt"):
        replicas.pull("r1")


# --- random runs -----------------------------------------------------------------------


class ReplicatedLog(RuleBasedStateMachine):
    """Three replicas on real files, ack quorum 2: appends, partial fetches, restarts of
    any replica, elections from any two, and stale leaders that keep appending and
    shipping. Whatever a leader's high watermark covered stays, at its offset, in every
    later leader's log; and each follower's log is a prefix-wise copy of what it pulled."""

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.replicas = Replicas(Path(self._tmp.name), Replication.of(3, 2))
        self.stale: list[LeaderReplica] = []
        self.committed: dict[int, tuple] = {}

    def _commit(self) -> None:
        replicas = self.replicas
        hw = replicas.leader.hw
        for batch in replicas.stored(replicas.leader_name):
            if batch[0] < hw:
                self.committed.setdefault(batch[0], batch)

    @rule(count=st.integers(1, 3))
    def append(self, count: int) -> None:
        self.replicas.append(count)
        self._commit()

    @rule(data=st.data())
    def stale_leader_appends_and_ships(self, data: st.DataObject) -> None:
        if not self.stale:
            return
        leader = data.draw(st.sampled_from(self.stale))
        replicas = self.replicas
        if leader.name == replicas.leader_name:
            return
        replicas.append(1, leader=leader)
        for name, follower in replicas.followers.items():
            if name == leader.name:
                continue
            # a follower still unfenced may take the stale leader's shipment
            with contextlib.suppress(StaleEpochError):
                follower.receive(leader.ship(follower.fetch(700)))

    @rule(data=st.data(), max_bytes=st.sampled_from([1, 300, 5000]))
    def pull(self, data: st.DataObject, max_bytes: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.replicas.followers)))
        self._told(name)
        self.replicas.pull(name, max_bytes=max_bytes)
        self._commit()

    def _told(self, name: str) -> None:
        """Replica ``name`` learns of the newest epoch (fenced, or told to follow): a
        leader it was stops leading, as the segment drops its leading role then."""
        self.stale = [leader for leader in self.stale if leader.name != name]

    @rule(data=st.data())
    def restart_a_follower(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.replicas.followers)))
        self._told(name)  # a restarted replica takes the role the metadata gives it
        self.replicas.restart(name)

    @rule(data=st.data())
    def elect(self, data: st.DataObject) -> None:
        reporters = data.draw(st.lists(st.sampled_from(self.replicas.names), min_size=2,
                                       max_size=3, unique=True))  # fmt: skip
        self.stale.append(self.replicas.leader)
        for name in reporters:
            self._told(name)
        self._told(self.replicas.elect(reporters))

    @invariant()
    def committed_entries_stay(self) -> None:
        replicas = self.replicas
        stored = {batch[0]: batch for batch in replicas.stored(replicas.leader_name)}
        for offset, batch in self.committed.items():
            assert stored.get(offset) == batch, (offset, replicas.leader_name)

    def teardown(self) -> None:
        for log in self.replicas.logs.values():
            log.close()
        self._tmp.cleanup()


TestReplicatedLog = ReplicatedLog.TestCase
TestReplicatedLog.settings = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
