"""What a recovery from storage makes of a segment's copies on several disks
(``storage.stored_copies``): one state per segment, its disk, its replica set."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from runtime.layout import HashRange, SegmentInfo
from runtime.names import TopicName
from runtime.recovery import StoredSegmentState
from runtime.replication import EpochHistory
from storage.replica_sets import ReplicaSet
from storage.replica_state import ReplicaState
from storage.stored_copies import (
    StoredCopy,
    copies_of,
    merged_states,
    placements,
    replica_sets,
)
from storage.topic_storage import (
    StoredIncarnation,
    StoredSegment,
    TopicIdentity,
    merge_incarnations,
    scan,
)

RANGE = HashRange(start=0, end=0xFFFF)
ACTIVE = SegmentInfo.active(0, RANGE, 0)
SEALED = ACTIVE.sealed(3, (1, 2))


def replica(last_epoch: int, high_watermark: int, seen: int | None = None) -> ReplicaState:
    history = EpochHistory().begin(last_epoch, 0) if last_epoch else EpochHistory()
    return ReplicaState(seen if seen is not None else last_epoch, history, high_watermark)


def copy(disk: str | None, info: SegmentInfo = ACTIVE, subs=(), fence=0, rep=None) -> StoredCopy:  # noqa: ANN001
    return StoredCopy(disk, StoredSegmentState(info, tuple(subs), fence), rep)


def test_a_seal_on_one_copy_wins_over_copies_that_had_not_heard_of_it() -> None:
    (state,) = merged_states([copy("a"), copy("b", SEALED), copy("c")])
    assert state.info == SEALED


def test_subscriptions_are_every_copys_and_the_fence_the_highest() -> None:
    (state,) = merged_states([copy("a", subs=["s"], fence=4), copy("b", subs=["t"], fence=7)])
    assert state.subscriptions == ("s", "t") and state.fence_epoch == 7


COPIES = st.lists(
    st.builds(
        copy,
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([ACTIVE, SEALED]),
        st.lists(st.sampled_from(["s", "t", "u"]), max_size=2),
        st.integers(0, 9),
    ),
    min_size=1,
    max_size=6,
)


@given(COPIES, st.randoms())
def test_the_merge_does_not_depend_on_the_order_the_disks_answered(copies, rng) -> None:  # noqa: ANN001
    shuffled = list(copies)
    rng.shuffle(shuffled)
    assert merged_states(shuffled) == merged_states(copies)


def test_a_replicated_segment_is_led_first_by_its_most_advanced_copy() -> None:
    copies = [
        copy("a", rep=replica(2, 40)),
        copy("b", rep=replica(3, 35, seen=5)),  # a newer epoch beats a longer log
        copy("c", rep=replica(2, 50)),
    ]
    assert replica_sets(copies) == {0: ReplicaSet(5, ("b", "c", "a"))}
    assert placements(copies, replica_sets(copies)) == {
        0: "b"
    }  # where its actor starts: the leader's disk


def test_a_segment_of_one_copy_gets_its_disk_and_no_replica_set() -> None:
    copies = [copy("a"), copy("b", SegmentInfo.active(1, RANGE, 0))]
    assert replica_sets(copies) == {}
    assert placements(copies, replica_sets(copies)) == {0: "a", 1: "b"}


def test_a_replica_laid_out_but_never_given_a_role_still_counts_at_epoch_one() -> None:
    copies = [copy("a", rep=ReplicaState()), copy("b", rep=ReplicaState())]
    assert replica_sets(copies)[0].epoch == 1
    assert sorted(replica_sets(copies)[0].replicas) == ["a", "b"]


def test_the_shared_root_records_nothing() -> None:
    assert (
        placements([copy(None)], {}) == {} and replica_sets([copy(None, rep=replica(1, 1))]) == {}
    )


def _incarnation(disk: str, epoch: int | None, *segments: str) -> StoredIncarnation:
    topic = TopicName.parse("topic://t/n/x")
    identity = None
    if epoch is not None:
        identity = TopicIdentity(
            topic=str(topic), incarnation="i1", rayNamespace="ns", createdAtMs=1, epoch=epoch
        )
    stored = [StoredSegment(s, Path(disk, s), None, 1, None) for s in segments]
    return StoredIncarnation(topic, "i1", Path(disk), identity, stored)


def test_an_incarnation_on_several_disks_is_one_with_the_newest_identity() -> None:
    (merged,) = merge_incarnations(
        [_incarnation("a", None, "s0"), _incarnation("b", 4, "s0", "s1"), _incarnation("c", 2)]
    )
    assert merged.identity is not None and merged.identity.epoch == 4
    assert sorted(s.descriptor for s in merged.segments) == ["s0", "s1"]


def test_copies_are_read_from_a_real_directory(tmp_path: Path) -> None:
    from storage.durability import Durability
    from storage.replica_state import ReplicaStateFile
    from storage.segment_store import SegmentStore

    topic = TopicName.parse("topic://t/n/x")
    name = ACTIVE.name(topic)
    store = SegmentStore(name, tmp_path, Durability(), incarnation="20261206T000000Z-0000abcd",
                         create=True, info=ACTIVE)  # fmt: skip
    store.close()
    (stored,) = scan(tmp_path, topic)
    (plain,) = copies_of(stored, "d1")
    assert plain.disk == "d1" and plain.replica is None and plain.state.info == ACTIVE
    ReplicaStateFile(store.directory, Durability()).save(replica(2, 7))
    (replicated,) = copies_of(stored, "d1")
    assert replicated.replica == replica(2, 7)
