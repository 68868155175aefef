"""What the controller does next for a replicated segment (``runtime.replica_plan``)."""

from __future__ import annotations

from runtime.replica_plan import (
    Elect,
    HandOver,
    Rebuild,
    Replace,
    Resize,
    RoleAnswer,
    Tell,
    Unavailable,
    hand_over_steps,
    next_steps,
    resize_steps,
)
from runtime.replication import Replication

THREE = Replication.of(3, 2)  # an election needs 2 answers
SET = ("d1", "d2", "d3")
LEADS, FOLLOWS = RoleAnswer("leader", 4), RoleAnswer("follower", 4)
HEALTHY = {"d1": LEADS, "d2": FOLLOWS, "d3": FOLLOWS}


def steps(answers: dict, gone: set[str] = frozenset(), free: tuple[str, ...] = ()) -> list:
    return next_steps(SET, 4, answers, set(gone), free, THREE)


def test_a_healthy_segment_needs_nothing() -> None:
    assert steps(HEALTHY) == []


def test_a_silent_leader_is_waited_for_until_its_node_is_lost() -> None:
    silent = HEALTHY | {"d1": None}
    assert steps(silent) == []
    assert steps(silent, gone={"d1"}) == [Elect(("d2", "d3"))]


def test_a_leader_that_restarted_is_never_told_to_lead_again_it_is_elected() -> None:
    """Its log may have lost a tail its followers hold: only an election may pick it."""
    assert steps(HEALTHY | {"d1": RoleAnswer("none", 0)}) == [Elect(("d1", "d2", "d3"))]
    assert steps(HEALTHY | {"d1": RoleAnswer("leader", 3)}) == [Elect(("d1", "d2", "d3"))]


def test_without_enough_answers_there_is_no_election() -> None:
    (step,) = steps({"d1": None, "d2": FOLLOWS, "d3": None}, gone={"d1", "d3"})
    assert isinstance(step, Unavailable)
    assert "needs 2 of 3 replicas with their files; 1 answer" in step.why
    assert "(d1 does not answer, d3 does not answer)" in step.why  # which, for the operator


def test_followers_are_told_their_role_or_replaced_once_lost() -> None:
    assert steps(HEALTHY | {"d2": RoleAnswer("none", 0)}) == [Tell("d2")]
    assert steps(HEALTHY | {"d3": RoleAnswer("leader", 3)}) == [Tell("d3")]  # a stale leader
    assert steps(HEALTHY | {"d3": None}) == []  # slow: waited for
    assert steps(HEALTHY | {"d3": None}, gone={"d3"}, free=("d7", "d8")) == [Replace("d3", "d7")]
    both = HEALTHY | {"d2": None, "d3": None}
    assert steps(both, gone={"d2", "d3"}, free=("d7", "d8")) == [
        Replace("d2", "d7"), Replace("d3", "d8"),
    ]  # fmt: skip
    (step,) = steps(HEALTHY | {"d3": None}, gone={"d3"})
    assert isinstance(step, Unavailable) and "no other node is free" in step.why


def test_a_new_segments_followers_lost_before_its_first_election_are_replaced() -> None:
    """Placed on nodes already lost (Ray had not said so yet): they hold nothing, as a
    follower copies only from an elected leader, so free disks take their places and the
    first election can have its answers; its leader, which may hold a copy of its own, is
    never replaced."""
    new = {"d1": RoleAnswer("none", 0), "d2": None, "d3": None}

    def first(answers: dict, gone: set[str], free: tuple[str, ...] = ()) -> list:
        return next_steps(SET, 1, answers, gone, free, THREE)

    assert first(new, gone={"d2", "d3"}, free=("d7", "d8")) == [
        Replace("d2", "d7"), Replace("d3", "d8"),
    ]  # fmt: skip
    assert first(new, gone={"d2", "d3"}, free=("d7",)) == [Replace("d2", "d7")]
    assert first(new, gone={"d3"}, free=("d7",)) == [Replace("d3", "d7")]  # d2 slow: kept
    (step,) = first(new, gone={"d2", "d3"})
    assert isinstance(step, Unavailable) and "1 answer" in step.why
    one_lost = new | {"d2": RoleAnswer("none", 0)}
    assert first(one_lost, gone={"d3"}, free=("d7",)) == [Elect(("d1", "d2"))]  # 2 of 3 do
    (step,) = first({"d1": None, "d2": None, "d3": None}, gone=set(SET), free=("d7", "d8"))
    assert isinstance(step, Unavailable)  # a lost leader is not replaced
    # once elected, only the leader can make a follower hold something: never replaced
    # while too few answer for the next election
    (step,) = steps({"d1": RoleAnswer("none", 0), "d2": None, "d3": None}, {"d2", "d3"}, ("d7",))
    assert isinstance(step, Unavailable)


def test_a_replica_whose_files_are_gone_is_rebuilt_and_never_elected() -> None:
    lost = RoleAnswer("follower", 4, lost=True)
    assert steps(HEALTHY | {"d3": lost}) == [Rebuild("d3")]
    assert steps(HEALTHY | {"d2": RoleAnswer("none", 0, lost=True)}) == [Rebuild("d2")]
    # a leader that lost them: fenced with the others, the lead goes to one that has them
    assert steps(HEALTHY | {"d1": RoleAnswer("leader", 4, lost=True)}) == [
        Elect(("d2", "d3"), also_fenced=("d1",))
    ]
    (step,) = steps({"d1": RoleAnswer("leader", 4, lost=True), "d2": lost, "d3": FOLLOWS})
    assert isinstance(step, Unavailable) and "with their files; 1 answer" in step.why
    assert "(d1 lost its files, d2 lost its files)" in step.why


# --- the policy's shape --------------------------------------------------------------------


def test_a_segment_is_brought_to_the_policys_factor_while_free_nodes_last() -> None:
    three, two = Replication.of(3, 2), Replication.of(2)
    assert resize_steps(("a", "b"), ("a", "b"), 2, ["c", "d"], three) == [Resize(3, ("c",))]
    assert resize_steps(("a",), ("a",), 1, ["c"], three) == [Resize(2, ("c",))]  # what there is
    assert resize_steps(("a",), ("a",), 1, [], three) == []  # no free node: wait for one
    assert resize_steps(("a", "b", "c"), ("a", "b", "c"), 2, ["d"], two) == [Resize(2)]
    assert resize_steps(("a", "b", "c"), ("a", "b", "c"), 2, ["d"], three) == []  # as asked


def test_a_leader_counting_another_ack_quorum_is_replaced_by_an_election() -> None:
    strict = Replication.of(3, 3)
    assert resize_steps(("a", "b", "c"), ("a", "b"), 2, [], strict) == [Elect(("a", "b"))]
    assert resize_steps(("a", "b", "c"), ("a", "b", "c"), None, [], strict) == []  # unknown
    loose = Replication.of(3, 1)  # an election must then hear from all three
    assert resize_steps(("a", "b", "c"), ("a", "b"), 2, [], loose) == []


def test_a_lead_on_the_controllers_node_goes_to_the_first_in_sync_follower_elsewhere() -> None:
    synced = {"d1", "d2", "d3"}
    assert hand_over_steps(SET, 4, HEALTHY, synced, {"d1"}) == [HandOver("d2")]
    assert hand_over_steps(SET, 4, HEALTHY, {"d1", "d3"}, {"d1"}) == [HandOver("d3")]
    assert hand_over_steps(SET, 4, HEALTHY, synced, {"d2"}) == []  # the leader is elsewhere
    assert hand_over_steps(SET, 4, HEALTHY, {"d1"}, {"d1"}) == []  # nobody caught up
    assert hand_over_steps(SET, 4, HEALTHY, synced, set(SET)) == []  # nowhere else
    lagging_epoch = {**HEALTHY, "d2": RoleAnswer("follower", 3), "d3": None}
    assert hand_over_steps(SET, 4, lagging_epoch, synced, {"d1"}) == []
    assert hand_over_steps(SET, 4, {**HEALTHY, "d1": None}, synced, {"d1"}) == []
