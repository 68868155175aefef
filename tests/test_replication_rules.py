"""The rules of replicated segments (``runtime.replication``), without Ray: each function
alone, then all of them in a simulated replica set whose leaders crash, whose stale
leaders keep writing, and whose elections hear from random replicas, checking that no
acknowledged entry is ever lost or changed."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runtime.errors import (
    InconsistentRequestError,
    InvalidArgumentError,
    NotEnoughNodesError,
    UnavailableError,
)
from runtime.policy import TopicPolicy
from runtime.replication import (
    MAX_REPLICATION_FACTOR,
    Copy,
    EpochHistory,
    EpochStart,
    NotEnoughReplicasError,
    ReplicaProgress,
    ReplicaReport,
    Replication,
    admits,
    choose_leader,
    divergence,
    follow,
    high_watermark,
)


def history(*starts: tuple[int, int]) -> EpochHistory:
    return EpochHistory(tuple(EpochStart(epoch, offset) for epoch, offset in starts))


# --- settings --------------------------------------------------------------------------


@pytest.mark.parametrize(("factor", "quorum"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_the_ack_quorum_defaults_to_a_majority(factor: int, quorum: int) -> None:
    assert Replication.of(factor) == Replication(factor, quorum)


@pytest.mark.parametrize(
    ("factor", "quorum", "says"),
    [
        (0, None, "1 to 7, got 0"),
        (MAX_REPLICATION_FACTOR + 1, None, "got 8"),
        (True, None, "an integer"),
        ("3", None, "an integer"),
        (3, 0, "from 1 to the factor (3), got 0"),
        (3, 4, "got 4"),
        (3, 2.0, "got 2.0"),
    ],
)
def test_bad_settings_are_refused_saying_what_is_allowed(factor, quorum, says) -> None:
    with pytest.raises(InvalidArgumentError, match=says.replace("(", r"\(").replace(")", r"\)")):
        Replication.of(factor, quorum)


def test_an_election_hears_from_enough_replicas_to_meet_every_ack_quorum() -> None:
    assert Replication.of(3, 2).reports_needed == 2
    assert Replication.of(3, 3).reports_needed == 1
    assert Replication.of(3, 1).reports_needed == 3
    assert Replication.of(1).reports_needed == 1


def test_a_factor_larger_than_the_nodes_is_refused_naming_how_many_there_are() -> None:
    Replication.of(3, 2).check_nodes(3)
    with pytest.raises(NotEnoughNodesError, match="needs 3 nodes.*placement allows 2") as err:
        Replication.of(3, 2).check_nodes(2)
    assert err.value.http_status == 409 and err.value.code == "not_enough_nodes"


# --- epoch histories and divergence -------------------------------------------------------


def test_epochs_rise_and_never_begin_before_their_predecessor() -> None:
    h = EpochHistory().begin(1, 0).begin(3, 5)
    assert h.last_epoch == 3 and EpochHistory().last_epoch == 0
    with pytest.raises(ValueError, match="does not follow"):
        h.begin(3, 9)
    with pytest.raises(ValueError, match="before its predecessor"):
        h.begin(4, 4)


def test_where_an_epoch_ends_is_where_the_next_began_or_the_log_ends() -> None:
    h = history((1, 0), (3, 5), (4, 9))
    assert h.end_of(1, 12) == (1, 5)
    assert h.end_of(2, 12) == (1, 5)  # never had epoch 2: the newest before it
    assert h.end_of(3, 12) == (3, 9)
    assert h.end_of(4, 12) == (4, 12)
    assert h.end_of(7, 12) == (4, 12)
    assert history((2, 3)).end_of(1, 8) == (0, 3)  # every epoch here is later


def test_a_truncated_history_keeps_the_epochs_begun_by_the_cut() -> None:
    h = history((1, 0), (3, 5), (4, 9))
    assert h.truncated(9) == h
    assert h.truncated(8) == history((1, 0), (3, 5))
    assert h.truncated(0) == history((1, 0))


def test_a_follower_keeps_what_matches_its_leader() -> None:
    leader = history((1, 0), (3, 5))
    assert divergence(leader, 9, history((1, 0), (3, 5)), 7) == 7  # behind: keeps it all
    assert divergence(leader, 9, history((1, 0)), 8) == 5  # epoch 1's tail past 5 never committed
    # epoch 2's entries were never the leader's: gone, and epoch 1 matches up to 5
    assert divergence(leader, 9, history((1, 0), (2, 4)), 7) == 4
    assert divergence(leader, 9, history((2, 0)), 3) == 0
    assert divergence(leader, 9, EpochHistory(), 0) == 0


def test_entries_from_before_any_epoch_match_up_to_the_leaders_first_epoch() -> None:
    """A segment replicated only once it held data: what its one writer stored before the
    first epoch is the same in every copy, and a follower's copy of it is kept."""
    leader = history((1, 10))
    assert divergence(leader, 15, EpochHistory(), 6) == 6
    assert divergence(leader, 15, EpochHistory(), 12) == 10
    assert divergence(EpochHistory(), 9, EpochHistory(), 5) == 5
    assert divergence(leader, 15, history((2, 8)), 12) == 8  # epoch 2 never was: cut to it


# --- the high watermark ---------------------------------------------------------------------


def test_the_high_watermark_is_the_quorums_smallest_end() -> None:
    assert high_watermark(10, [7, 4], 1) == 10
    assert high_watermark(10, [7, 4], 2) == 7
    assert high_watermark(10, [7, 4], 3) == 4
    assert high_watermark(10, [12], 2) == 10  # a follower never counts past its leader
    assert high_watermark(10, [], 2) == 0


def test_progress_never_moves_back_and_ignores_answers_about_another_epoch() -> None:
    progress = ReplicaProgress.starting(epoch=2, ack_quorum=2, leader_end=10, hw=3)
    assert progress.hw == 3
    assert progress.matched("b", epoch=1, end=9) == 3  # late, from the old leader's time
    assert progress.matched("b", epoch=2, end=8) == 8
    progress.forget("b")
    assert progress.appended(12) == 8  # no quorum any more, but 8 stays committed
    assert ReplicaProgress.starting(2, 2, leader_end=4, hw=6).hw == 4


# --- elections --------------------------------------------------------------------------------


def test_an_election_refuses_to_choose_without_enough_reports() -> None:
    with pytest.raises(NotEnoughReplicasError, match="needs 2 of 3 replicas.*1 answered") as err:
        choose_leader([ReplicaReport("a", 1, 5)], Replication.of(3, 2))
    assert isinstance(err.value, UnavailableError) and err.value.http_status == 503


def test_the_newest_epoch_wins_then_the_longest_log_then_the_name() -> None:
    replication = Replication.of(3, 2)
    newer = ReplicaReport("a", 3, 4)
    assert choose_leader([ReplicaReport("b", 2, 9), newer], replication) == newer
    longer = ReplicaReport("c", 3, 6)
    assert choose_leader([newer, longer], replication) == longer
    tie = [ReplicaReport("b", 3, 6), longer]
    assert choose_leader(tie, replication) == choose_leader(tie[::-1], replication) == longer
    # A tie goes to the leader the record names first, never past a more up-to-date log
    assert choose_leader(tie, replication, prefer="b") == tie[0]
    assert choose_leader([newer, longer], replication, prefer="a") == longer
    # A replica on the controller's node leads only when none elsewhere is as up to date
    assert choose_leader(tie, replication, prefer="c", avoid=frozenset({"c"})) == tie[0]
    assert choose_leader([newer, longer], replication, avoid=frozenset({"c"})) == longer


def test_a_replica_refuses_frames_from_before_the_newest_epoch_it_saw() -> None:
    assert admits(3, 3) and admits(4, 3)
    assert not admits(2, 3)


def test_a_follower_cuts_its_tail_and_stores_a_copy_only_where_it_matches() -> None:
    mine, leaders = history((1, 0), (2, 4)), history((1, 0), (3, 5))
    assert follow(4, mine, 7, 3, leaders, 9, copy_from=4) == Copy(accepted=False)
    assert follow(2, mine, 7, 3, leaders, 9, copy_from=4) == Copy(True, keep=4, store=True)
    # sent from further on than what matches: cut, store nothing, be sent from 4 again
    assert follow(2, mine, 7, 3, leaders, 9, copy_from=7) == Copy(True, keep=4, store=False)


# --- a replica set, simulated ----------------------------------------------------------------


@dataclass
class Replica:
    log: list[tuple[int, int]] = field(default_factory=list)  # (epoch, value) per offset
    history: EpochHistory = EpochHistory()
    seen: int = 0  # the newest epoch this replica heard of
    known_hw: int = 0  # the committed end its leader last told it
    alive: bool = True


class Simulation:
    """Replicas with logs, their leaders' progress, and everything acknowledged so far.

    Leaders of every epoch (the current one and stale ones that do not know yet) append
    and send partial copies; replicas crash and come back with their logs; the controller
    elects from the fenced replicas it heard. Every entry a leader's high watermark
    covered was acknowledged: it must stay, at its offset, in every later leader's log."""

    def __init__(self, replication: Replication) -> None:
        self.replication = replication
        self.replicas = {f"r{i}": Replica() for i in range(replication.factor)}
        self.epoch = 1
        self.leaders: dict[int, tuple[str, ReplicaProgress]] = {}
        self.acked: dict[int, tuple[int, int]] = {}
        self.next_value = 0
        self._lead("r0", 1)

    def _lead(self, name: str, epoch: int) -> None:
        replica = self.replicas[name]
        replica.seen = epoch
        replica.history = replica.history.begin(epoch, len(replica.log))
        progress = ReplicaProgress.starting(
            epoch, self.replication.ack_quorum, len(replica.log), replica.known_hw
        )
        self.leaders[epoch] = (name, progress)
        self._acknowledge(name, progress.appended(len(replica.log)))

    def _acknowledge(self, leader: str, hw: int) -> None:
        """A leader acknowledges (and serves) what its high watermark covers."""
        log = self.replicas[leader].log
        for offset in range(hw):
            entry = self.acked.setdefault(offset, log[offset])
            assert entry == log[offset], (
                f"offset {offset} acknowledged as {entry} and {log[offset]}"
            )

    def append(self, epoch: int, count: int = 1) -> None:
        name, progress = self.leaders[epoch]
        leader = self.replicas[name]
        if not leader.alive or not admits(epoch, leader.seen):
            return  # a leader that heard of a newer epoch writes nothing more
        for _ in range(count):
            leader.log.append((epoch, self.next_value))
            self.next_value += 1
        self._acknowledge(name, progress.appended(len(leader.log)))

    def replicate(self, epoch: int, follower_name: str, copies: int) -> None:
        name, progress = self.leaders[epoch]
        leader, follower = self.replicas[name], self.replicas[follower_name]
        if follower_name == name or not (leader.alive and follower.alive):
            return
        if not admits(epoch, leader.seen):
            return  # a leader that heard of a newer epoch sends nothing
        # The leader sends from what it last heard the follower holds; here, where they match
        # (a copy from elsewhere is answered with ``keep``, and sent again from there)
        start = divergence(leader.history, len(leader.log), follower.history, len(follower.log))
        step = follow(
            follower.seen, follower.history, len(follower.log),
            epoch, leader.history, len(leader.log), copy_from=start,
        )  # fmt: skip
        if not step.accepted:
            return
        assert step.store and step.keep == start
        follower.seen = epoch
        end = min(len(leader.log), step.keep + copies)
        follower.log = follower.log[: step.keep] + leader.log[step.keep : end]
        follower.history = leader.history.truncated(end)
        hw = progress.matched(follower_name, follower.history.last_epoch, end)
        follower.known_hw = max(follower.known_hw, min(hw, end))
        self._acknowledge(name, hw)

    def crash(self, name: str) -> None:
        self.replicas[name].alive = False

    def restart(self, name: str) -> None:
        self.replicas[name].alive = True
        for epoch, (leader, progress) in self.leaders.items():
            if leader == name:  # its followers' progress was in memory: heard again as they answer
                self.leaders[epoch] = (leader, ReplicaProgress.starting(
                    epoch, progress.ack_quorum, len(self.replicas[name].log), progress.hw
                ))  # fmt: skip

    def elect(self, reporters: list[str]) -> str:
        epoch = self.epoch + 1
        reports = []
        for name in reporters:  # fencing: each refuses every leader before ``epoch`` from now
            replica = self.replicas[name]
            replica.seen = max(replica.seen, epoch)
            reports.append(ReplicaReport(name, replica.history.last_epoch, len(replica.log)))
        chosen = choose_leader(reports, self.replication)
        self.epoch = epoch  # the metadata's compare-and-swap
        self._lead(chosen.replica, epoch)
        return chosen.replica

    def check(self) -> None:
        name, _ = self.leaders[self.epoch]
        log = self.replicas[name].log
        for offset, entry in self.acked.items():
            assert offset < len(log) and log[offset] == entry, (
                f"acknowledged {entry} at {offset} is not in {name}'s log of epoch {self.epoch}"
            )


def _an_uncommitted_tail_on_r0(count: int) -> Simulation:
    """Three replicas, ack quorum 2: A committed at offset 0 on r0 and r1, then ``count``
    entries of epoch 1 on r0 only."""
    sim = Simulation(Replication.of(3, 2))
    sim.append(1)
    sim.replicate(1, "r1", copies=1)
    sim.append(1, count=count)
    assert sim.acked == {0: (1, 0)}
    return sim


def test_copies_of_an_old_epochs_tail_commit_nothing_until_the_follower_adopts_the_new_one():
    """Raft's figure 8, on three replicas: r0 comes back to lead epoch 3 with a tail (B)
    that epoch 1 never committed, and copies it to r2 without r2 reaching epoch 3's start.
    Had that copy counted, B would be acknowledged, and the next election, which prefers
    r1's newer epoch 2, would drop it."""
    sim = _an_uncommitted_tail_on_r0(2)  # B, B2
    assert sim.elect(["r1", "r2"]) == "r1"
    sim.append(2)  # C at offset 1, on r1 only
    assert sim.elect(["r0", "r2"]) == "r0"  # epoch 3 begins at r0's end, 3
    sim.replicate(3, "r2", copies=2)  # A, B: short of epoch 3's start
    assert sim.acked == {0: (1, 0)}
    sim.crash("r0")
    assert sim.elect(["r1", "r2"]) == "r1"
    sim.check()


def test_the_newest_epoch_beats_a_longer_log_from_an_older_one():
    sim = _an_uncommitted_tail_on_r0(2)  # longer than anything after it
    assert sim.elect(["r1", "r2"]) == "r1"
    sim.append(2)
    sim.replicate(2, "r2", copies=5)  # C committed on r1 and r2
    assert sim.acked[1] == (2, 3)
    sim.crash("r1")
    assert sim.elect(["r0", "r2"]) == "r2"
    sim.check()


def test_a_rejoining_follower_drops_the_tail_its_new_leader_never_had():
    sim = _an_uncommitted_tail_on_r0(1)  # B at offset 1
    sim.crash("r0")
    assert sim.elect(["r1", "r2"]) == "r1"
    sim.append(2)  # C at offset 1
    sim.replicate(2, "r2", copies=5)
    sim.restart("r0")
    sim.replicate(2, "r0", copies=0)
    assert [e for _, e in sim.replicas["r0"].log] == [0]  # B is gone
    sim.append(2)  # D at offset 2
    sim.replicate(2, "r0", copies=5)
    assert sim.replicas["r0"].log == sim.replicas["r1"].log
    sim.crash("r1")
    assert sim.elect(["r0", "r2"]) == "r0"
    sim.check()


def test_a_stale_leader_cannot_take_back_what_its_successor_committed():
    sim = _an_uncommitted_tail_on_r0(2)
    assert sim.elect(["r1", "r2"]) == "r1"  # r0 does not know yet
    sim.append(2)
    sim.replicate(2, "r2", copies=5)  # C committed on r1 and r2
    before = list(sim.replicas["r2"].log)
    sim.replicate(1, "r2", copies=5)  # r0, leader of epoch 1, copies its log to r2: refused
    sim.append(1)  # and writes on, alone
    assert sim.replicas["r2"].log == before
    sim.crash("r1")
    assert sim.elect(["r0", "r2"]) == "r2"
    sim.check()


class ReplicaSet(RuleBasedStateMachine):
    """The simulation driven at random: any leader (stale ones too) appends or copies to
    any replica, replicas crash and restart, elections hear from random replicas."""

    @initialize(factor=st.integers(1, 5), data=st.data())
    def start(self, factor: int, data: st.DataObject) -> None:
        self.sim = Simulation(Replication.of(factor, data.draw(st.integers(1, factor))))

    def _epoch(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.sim.leaders)), label="leader's epoch")

    def _replica(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.sim.replicas)), label="replica")

    @rule(data=st.data(), count=st.integers(1, 3))
    def append(self, data: st.DataObject, count: int) -> None:
        self.sim.append(self._epoch(data), count)

    @rule(data=st.data(), copies=st.integers(0, 4))
    def replicate(self, data: st.DataObject, copies: int) -> None:
        self.sim.replicate(self._epoch(data), self._replica(data), copies)

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        self.sim.crash(self._replica(data))

    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        self.sim.restart(self._replica(data))

    @rule(data=st.data())
    def elect(self, data: st.DataObject) -> None:
        alive = sorted(name for name, replica in self.sim.replicas.items() if replica.alive)
        needed = self.sim.replication.reports_needed
        if len(alive) >= needed:
            size = data.draw(st.integers(needed, len(alive)))
            self.sim.elect(data.draw(st.permutations(alive))[:size])

    @invariant()
    def the_current_leader_holds_every_acknowledged_entry(self) -> None:
        self.sim.check()


ReplicaSet.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_no_acknowledged_entry_is_lost_through_crashes_elections_and_stale_leaders = ReplicaSet.TestCase


def test_the_policys_replication_part_is_checked_and_inherited_whole() -> None:
    assert TopicPolicy.parse({}).replicas == Replication(1, 1)  # one copy by default
    assert TopicPolicy.parse({"replication": {"factor": 3}}).replicas == Replication(3, 2)
    strict = TopicPolicy.parse({"replication": {"factor": 3, "ackQuorum": 3}})
    assert strict.to_dict()["replication"] == {"factor": 3, "ackQuorum": 3}
    with pytest.raises(InconsistentRequestError, match="ackQuorum 4 > factor 3") as err:
        TopicPolicy.parse({"replication": {"factor": 3, "ackQuorum": 4}})
    assert err.value.http_status == 409  # each field valid: the combination is refused
    for bad in ({"factor": 0}, {"factor": 8}, {"factor": 3, "ackQuorum": 0}, {"factor": "3"}):
        with pytest.raises(InvalidArgumentError, match="replication"):
            TopicPolicy.parse({"replication": bad})
    default = TopicPolicy.parse({"replication": {"factor": 3}})
    assert TopicPolicy.parse({"retention": {"timeS": 60}}).over(default).replicas.factor == 3
    assert strict.over(default).replicas == Replication(3, 3)  # the topic's own part wins
