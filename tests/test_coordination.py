"""When a subscription's coordinator evicts silent consumers (``runtime.coordination``):
it sleeps until ``next_expiry`` instead of checking on a timer, so that deadline must
never pass a session that has expired, and never come before the first one does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.assignment import Share
from runtime.coordination import GroupState
from runtime.layout import SegmentLayout

GRACE_S = 30.0
times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(st.dictionaries(st.sampled_from("abcdef"), times, min_size=1), times)
def test_nobody_expires_before_the_next_expiry_and_someone_just_after(
    seen: dict[str, float], now: float
) -> None:
    state = GroupState()
    for consumer, at in seen.items():
        state.join(consumer, at)
    due = state.next_expiry(GRACE_S)
    assert due is not None
    if now <= due:
        assert state.expired(now, GRACE_S) == []
    assert state.expired(due + 0.05, GRACE_S) != []


def test_a_consumer_heard_from_moves_only_its_own_deadline_later() -> None:
    state = GroupState()
    assert state.next_expiry(GRACE_S) is None  # nothing to expire: the coordinator waits
    state.join("a", 10.0)
    state.join("b", 20.0)
    assert state.next_expiry(GRACE_S) == 40.0
    state.seen("a", 25.0)
    assert state.next_expiry(GRACE_S) == 50.0
    assert state.expired(50.1, GRACE_S) == ["b"]
    state.leave("b")
    assert state.next_expiry(GRACE_S) == 55.0


def test_a_state_built_anew_hands_out_no_version_a_consumer_may_hold_from_before() -> None:
    """A coordinator that restarts builds its group state anew. Were its versions to count
    from where the last one's did, a consumer holding version v of the old assignment
    (two parents) would take the new one's v (their merged child) for the one it has,
    and never read on: what chaos seed 2 once showed, after a merge and a coordinator kill."""
    parents = SegmentLayout.initial(2)
    before = GroupState(version_base=1_000)
    before.join("a", 0.0)
    before.rebalance(parents)
    held = before.sessions["a"].version
    assert before.view("a") == (Share(0), Share(1)) and held > 1_000
    after = GroupState(version_base=2_000)  # a later incarnation: a later start
    after.join("a", 1.0)
    for _ in range(held - 1_000):  # as many changes as the first saw
        after.rebalance(parents)
    assert after.sessions["a"].version != held


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("join", "leave", "hand", "release", "split", "merge", "finish")),
            st.integers(0, 11),
        ),
        max_size=40,
    ),
    st.sampled_from([1, 4, 256]),
)
def test_no_key_bucket_is_ever_held_by_two_consumers(
    events: list[tuple[str, int]], buckets: int
) -> None:
    """Through joins, leaves, releases, splits, merges and finished segments, the shares
    held never overlap (a key reaches one consumer at a time), a consumer's view holds
    only what it owns, and once every share being given up is released the views are
    the balance itself: every readable bucket held, every consumer reading."""
    layout, state = SegmentLayout.initial(2), GroupState(buckets=buckets)
    for kind, n in events:
        name = f"c{n}"
        if kind == "join":
            state.join(name, 0.0)
        elif kind == "leave":
            state.leave(name)
        elif kind == "hand":
            state.handed_out(name)
        elif kind == "release":
            for share in [s for s in state.revoked if state.owners[s] == name]:
                state.release(name, share.segment_id)
        elif kind in ("split", "merge") and len(layout.active_segments) < 6:
            active = sorted(layout.active_segments, key=lambda i: layout.get(i).hash_range.start)
            if kind == "split":
                layout = layout.split_segment(active[n % len(active)])
            elif len(active) > 1:
                i = n % (len(active) - 1)
                layout = layout.merge_segments(active[i], active[i + 1])
        elif kind == "finish":
            sealed = [i for i in layout.readable(state.finished) if not i.is_active]
            if sealed:
                state.finish(sealed[n % len(sealed)].segment_id)
        state.rebalance(layout)
        held = sorted(state.owners)
        assert not any(a.overlaps(b) for i, a in enumerate(held) for b in held[i + 1 :]), held
        for consumer in state.sessions:
            assert all(state.owners[s] == consumer for s in state.view(consumer))
            held = [s.segment_id for s in state.owned(consumer)]
            assert len(held) == len(set(held)), "one run of a segment at a time"
    for _ in range(3):  # everyone gives up what it was asked to
        assert state.revoked <= state.handed  # a share its owner never saw waits for nobody
        for share in list(state.revoked):
            state.release(state.owners[share], share.segment_id)
        state.rebalance(layout)
    assert not state.revoked
    readable = layout.readable(state.finished)
    if state.sessions and readable:
        assert {s.segment_id for s in state.owners} == {i.segment_id for i in readable}
        sharing = len(state.sessions) > len(readable) and buckets > 1
        reading = {c for c in state.sessions if state.view(c)}
        assert len(reading) == (
            min(len(state.sessions), len(readable) * buckets)
            if sharing
            else min(len(state.sessions), len(readable))
        )


def _a_reads_one_segment_and_b_joins() -> tuple[SegmentLayout, GroupState]:
    layout = SegmentLayout.initial(1)
    state = GroupState(buckets=4)
    state.join("a", 0.0)
    state.rebalance(layout)
    state.handed_out("a")  # a reads the whole segment
    state.join("b", 0.0)
    return layout, state


def test_a_share_taken_back_before_its_owner_heard_of_it_waits_for_no_release() -> None:
    """Granted to ``a`` and moved on before ``a`` polled: ``a`` never reads it, so never
    releases it; the next owner gets it at once. One ``a`` was told of is released first."""
    layout, state = _a_reads_one_segment_and_b_joins()
    state.rebalance(layout)  # a's whole segment waits for a's release
    assert state.revoked == {Share(0)} and state.view("b") == ()
    state.release("a", 0)
    state.rebalance(layout)
    granted = dict(state.owners)
    assert sorted(granted.values()) == ["a", "b"]
    state.join("c", 0.0)  # before a or b heard of their halves: cut in three at once
    state.rebalance(layout)
    assert not state.revoked and sorted(state.owners.values()) == ["a", "b", "c"]
    assert all(s.end - s.start < 4 and s.count == 4 for s in state.owners)


def test_what_only_a_lost_answer_carried_waits_for_no_release() -> None:
    """``a``'s answer carrying its half of the segment never reached it: its next poll
    holds the version before. When a third consumer cuts the segment in three and moves
    that half, it is free at once; had ``a`` received it, it would wait for ``a``'s
    release."""
    layout, state = _a_reads_one_segment_and_b_joins()
    state.rebalance(layout)
    state.handed_out("a")  # a is told to give it up, and does
    told = state.sessions["a"].version
    state.release("a", 0)
    state.rebalance(layout)
    state.handed_out("a")  # a's half: this answer is lost
    state.handed_out("b")  # b's half reaches b
    state.join("c", 0.0)
    state.rebalance(layout)
    (moved,) = state.revoked
    assert state.owners[moved] == "a"
    assert not state.confirmed("a", -1)  # a version never answered tells nothing
    assert state.confirmed("a", told)
    assert moved not in state.owners and not state.revoked
    assert not state.confirmed("a", told)  # nothing more to free
    state.rebalance(layout)
    assert sorted(state.owners.values()) == ["a", "b", "c"]


def test_a_share_received_before_a_lost_answer_still_waits_for_its_release() -> None:
    """``a`` received the whole of segment 0; the next answer, which still carried it, was
    lost. Its poll holds the older version, which carried the segment too: ``a`` may be
    reading it, so the segment moves only once ``a`` released it."""
    layout = SegmentLayout.initial(2)
    state = GroupState(buckets=4)
    state.join("a", 0.0)
    state.rebalance(layout)
    state.handed_out("a")  # a reads both segments
    received = state.sessions["a"].version
    state.join("b", 0.0)
    state.rebalance(layout)
    state.handed_out("a")  # a gives segment 1 up in this answer, which is lost
    state.release("a", 1)  # (as if a had)
    state.rebalance(layout)
    state.join("c", 0.0)
    state.join("d", 0.0)
    state.rebalance(layout)  # four consumers: segment 0 cut in two, a's whole one moves
    assert {state.owners[s] for s in state.revoked} == {"a"}
    assert not state.confirmed("a", received)
    assert {s.segment_id for s in state.revoked} == {0}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                ("join", "leave", "answer", "lose", "poll", "release", "split", "finish")
            ),
            st.integers(0, 3),
        ),
        max_size=50,
    ),
    st.sampled_from([1, 4]),
)
def test_lost_answers_never_let_two_consumers_read_the_same_bucket(
    events: list[tuple[str, int]], buckets: int
) -> None:
    """Consumers modelled as the client behaves: it registers (a lost registration is
    retried, so it is answered), an answer to a poll that arrives is applied (its shares
    read), one that is lost is not, a poll carries the version applied last and every
    answer is one to a poll (the coordinator hears the version before it answers:
    ``SubscriptionCoordinator.poll``), and a share dropped from the view is released once
    acknowledged. Whatever answers are
    lost, a share a consumer may be reading waits for its release (no bucket read by two
    at once), and once every consumer polled and released, nothing waits."""
    layout, state = SegmentLayout.initial(2), GroupState(buckets=buckets)
    applied: dict[str, int] = {}
    reading: dict[str, set[Share]] = {}  # received and not released

    def release(name: str) -> None:
        for share in [s for s in reading[name] if s not in state.view(name)]:
            if state.owners.get(share) == name:
                state.release(name, share.segment_id)
            reading[name].discard(share)

    for kind, n in events:
        name = f"c{n}"
        if kind == "join" and name not in state.sessions:  # registered, answered
            state.join(name, 0.0)
            state.rebalance(layout)
            state.handed_out(name)
            applied[name] = state.sessions[name].version
            reading[name] = set(state.view(name))
        elif name not in state.sessions:
            pass
        elif kind == "leave":
            state.leave(name)
            del applied[name], reading[name]
        elif kind == "answer":
            state.confirmed(name, applied[name])
            state.handed_out(name)
            applied[name] = state.sessions[name].version
            reading[name] |= set(state.view(name))
            for segment in state.releasing(name):  # never read here: released at once
                if not any(share.segment_id == segment for share in reading[name]):
                    state.release(name, segment)
        elif kind == "lose":
            state.confirmed(name, applied[name])
            state.handed_out(name)
        elif kind == "poll":
            state.confirmed(name, applied[name])
        elif kind == "release":
            release(name)
        if kind == "split" and len(layout.active_segments) < 5:
            layout = layout.split_segment(sorted(layout.active_segments)[n % 2])
        elif kind == "finish":
            sealed = [i for i in layout.readable(state.finished) if not i.is_active]
            if sealed:
                done = sealed[n % len(sealed)].segment_id
                state.finish(done)
                for shares in reading.values():
                    shares -= {s for s in shares if s.segment_id == done}
        state.rebalance(layout)
        read = [(c, s) for c, shares in reading.items() for s in shares]
        for i, (c1, s1) in enumerate(read):
            for c2, s2 in read[i + 1 :]:
                assert c1 == c2 or not s1.overlaps(s2), f"{c1} and {c2} read {s1} and {s2}"
    for _ in range(3):  # every consumer polls, applies its answer and releases
        for name in list(state.sessions):
            state.confirmed(name, applied[name])
            state.handed_out(name)
            applied[name] = state.sessions[name].version
            reading[name] |= set(state.view(name))
            release(name)
        state.rebalance(layout)
    assert not state.revoked


def test_a_share_restored_after_a_restart_is_released_by_an_owner_that_never_read_it() -> None:
    """The answer handing c0 segment 1 was lost, then the coordinator restarted and restored
    what c0 owned as possibly read. c1 joins and segment 1 is taken back from c0, which
    never reads it, so only the answer's ``releasing`` tells c0 to give it up."""
    layout, state = SegmentLayout.initial(2), GroupState()
    for share in (Share(0), Share(1)):  # restored from what the coordinator persisted
        state.owners[share] = "c0"
        state.handed.add(share)
    state.join("c0", 0.0)
    state.join("c1", 0.0)
    state.rebalance(layout)
    assert state.view("c1") == () and state.releasing("c0") == (1,)  # c1 waits for c0
    assert state.releasing("c1") == ()
    reading = {Share(0)}  # what c0's client read: segment 1 reached it in no answer
    for segment in state.releasing("c0"):
        if Share(segment) not in reading:
            state.release("c0", segment)
    state.rebalance(layout)
    assert state.view("c0") == (Share(0),) and state.view("c1") == (Share(1),)
    assert not state.revoked and state.releasing("c0") == ()
