"""The one authority of replication (``storage.replica_sets``): each replicated segment's
replicas and leader epoch, changed only by compare-and-swap, and where a new segment's
replicas go (``runtime.placement.choose_disks``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import BadVersion, InvalidArgumentError, UnavailableError
from runtime.names import TopicName
from runtime.placement import choose_disks
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.replica_sets import ReplicaSet, ReplicaSets

TOPIC = TopicName.parse("topic://acme/orders/replicated")


def sets() -> ReplicaSets:
    return ReplicaSets(MetadataStore(kv=MemoryKeyValue()), TOPIC, "inc-1")


def test_a_replica_set_is_created_once_and_read_back() -> None:
    records = sets()
    assert records.get(7) is None  # not replicated
    first = ReplicaSet(1, ("d1", "d2", "d3"))
    assert records.create(7, first) == first
    assert records.create(7, ReplicaSet(1, ("d4", "d5", "d6"))) == first  # a resumed create
    found = records.get(7)
    assert found is not None and found[0] == first
    assert (first.leader, first.followers) == ("d1", ("d2", "d3"))


def test_of_two_elections_from_one_version_one_wins() -> None:
    """Two controllers (a fenced one that does not know yet, and its successor) elect at
    once: the second compare-and-swap loses, and reading again shows who won."""
    records = sets()
    records.create(7, ReplicaSet(1, ("d1", "d2", "d3")))
    current, version = records.get(7)
    records.change(7, version, current.elected("d2"))
    with pytest.raises(BadVersion):
        records.change(7, version, current.elected("d3"))
    winner, _ = records.get(7)
    assert winner == ReplicaSet(2, ("d2", "d1", "d3"))


def test_changes_keep_the_rules() -> None:
    replicas = ReplicaSet(4, ("d1", "d2", "d3"))
    assert replicas.replaced("d3", "d9") == ReplicaSet(4, ("d1", "d2", "d9"))
    for gone, new in (("d1", "d9"), ("d7", "d9"), ("d2", "d3")):  # the leader, unknown, taken
        with pytest.raises(ValueError):
            replicas.replaced(gone, new)
    with pytest.raises(ValueError):
        replicas.elected("d9")
    for epoch, disks in ((0, ("d1",)), (1, ()), (1, ("d1", "d1"))):
        with pytest.raises(ValueError):
            ReplicaSet(epoch, disks)


@pytest.mark.parametrize(
    "raw", [b"{", b'{"epoch": 1}', b'{"epoch": true, "replicas": ["d1"]}',
            b'{"epoch": 0, "replicas": ["d1"]}', b'{"epoch": 1, "replicas": [1]}'],
)  # fmt: skip
def test_a_record_that_cannot_be_trusted_is_an_error_naming_it(raw: bytes) -> None:
    records = sets()
    records.store.put_if_absent(records._path(7), raw)
    with pytest.raises(UnavailableError, match="/replicas/inc-1/7 cannot be read"):
        records.get(7)


def test_replicas_go_to_distinct_disks_the_least_loaded_first() -> None:
    load = {"d1": 3, "d2": 0, "d3": 1, "d4": 0}
    assert choose_disks(load, 3) == ["d2", "d4", "d3"]
    assert choose_disks(load, 2, avoid={"d2"}) == ["d4", "d3"]
    with pytest.raises(InvalidArgumentError, match="5 replicas need 5 node disks.*4 are live"):
        choose_disks(load, 5)


@given(
    load=st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 9), min_size=1),
    data=st.data(),
)
def test_replicas_are_always_on_distinct_live_disks(load: dict[str, int], data) -> None:  # noqa: ANN001
    count = data.draw(st.integers(1, len(load)))
    avoid = set(data.draw(st.lists(st.sampled_from(sorted(load)))))
    chosen = choose_disks(load, count, avoid)
    assert len(chosen) == len(set(chosen)) == count and set(chosen) <= set(load)


def test_a_replica_set_is_resized_keeping_its_leader_and_epoch() -> None:
    record = ReplicaSet(4, ("a", "b", "c"))
    assert record.resized(2) == ReplicaSet(4, ("a", "b"))
    assert record.resized(1) == ReplicaSet(4, ("a",))
    assert record.resized(4, ("d",)) == ReplicaSet(4, ("a", "b", "c", "d"))
    for factor, new in ((4, ()), (4, ("b",)), (3, ("d",)), (5, ("d",))):
        with pytest.raises(ValueError):
            record.resized(factor, new)
