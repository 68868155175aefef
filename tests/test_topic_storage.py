"""Storage identity on real files: a segment opens only its own incarnation's storage,
keeps its place in the DAG beside its log, and a scan finds what recovery needs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runtime.batch import make_batch
from runtime.errors import (
    AmbiguousStorageError,
    StorageNotFoundError,
    UnavailableError,
)
from runtime.layout import SegmentLayout
from runtime.names import TopicName
from runtime.recovery import plan_recovery
from storage.durability import Durability
from storage.segment_store import SealedBy, SegmentStore
from storage.topic_storage import (
    TopicIdentity,
    choose_incarnation,
    is_incarnation,
    new_incarnation,
    scan,
    segment_directory,
    stored_states,
    write_topic_identity,
)

TOPIC = TopicName("acme", "prod", "orders")
FAST = Durability("none")


def lay_out(root: Path, layout: SegmentLayout, incarnation: str) -> dict[int, SegmentStore]:
    """Storage for every segment of ``layout``, as the controller lays it out."""
    stores = {}
    for info in layout.all_segments.values():
        name = TOPIC.segment(info.segment_id, info.hash_range.start, info.hash_range.end)
        stores[info.segment_id] = SegmentStore(
            name, root, FAST, incarnation=incarnation, create=True, info=info
        )
    return stores


def identity(incarnation: str, namespace: str = "ns-a", epoch: int = 0) -> TopicIdentity:
    return TopicIdentity(
        topic=str(TOPIC),
        incarnation=incarnation,
        ray_namespace=namespace,
        created_at_ms=1,
        epoch=epoch,
    )


def test_incarnation_ids_sort_by_creation_and_validate() -> None:
    first, second = new_incarnation(), new_incarnation()
    assert is_incarnation(first) and is_incarnation(second) and first != second
    for bad in ("", "x", "../etc", "20261125T000000Z-XYZ"):
        assert not is_incarnation(bad)


def test_each_incarnation_has_its_own_storage(tmp_path: Path) -> None:
    name = TOPIC.segment(0, 0, 0xFFFF)
    old, new = new_incarnation(), new_incarnation()
    first = SegmentStore(name, tmp_path, FAST, incarnation=old, create=True)
    first.append(make_batch([b"old message"]), None, None)
    first.close()
    second = SegmentStore(name, tmp_path, FAST, incarnation=new, create=True)
    assert second.stats()["records"] == 0, "a new incarnation never sees another's messages"
    second.close()
    with pytest.raises(UnavailableError, match="missing"):
        SegmentStore(name, tmp_path, FAST, incarnation=new_incarnation())
    assert segment_directory(tmp_path, name, old) != segment_directory(tmp_path, name, new)


def test_storage_of_another_segment_is_refused(tmp_path: Path) -> None:
    incarnation = new_incarnation()
    stores = lay_out(tmp_path, SegmentLayout.initial(2), incarnation)
    for store in stores.values():
        store.close()
    zero, one = (TOPIC.segment(0, 0, 0x7FFF), TOPIC.segment(1, 0x8000, 0xFFFF))
    target = segment_directory(tmp_path, one, incarnation)
    shutil.rmtree(target)
    shutil.copytree(segment_directory(tmp_path, zero, incarnation), target)
    with pytest.raises(UnavailableError, match="belongs to segment 0"):
        SegmentStore(one, tmp_path, FAST, incarnation=incarnation)


def test_sealing_records_the_children_and_a_scan_rebuilds_the_dag(tmp_path: Path) -> None:
    incarnation = new_incarnation()
    before = SegmentLayout.initial(2)
    after = before.split_segment(1)
    stores = lay_out(tmp_path, after, incarnation)  # children laid out (step 2)...
    for child in (2, 3):
        stores[child].create_subscription("billing", "earliest", 1)
    stores[0].create_subscription("billing", "earliest", 1)
    stores[1].terminate(5, SealedBy((2, 3), after.epoch))  # ...parent sealed (step 3)
    stores[1].terminate(5, SealedBy((2, 3), after.epoch))  # a resumed operation repeats it
    write_topic_identity(tmp_path, identity(incarnation))
    for store in stores.values():
        store.close()

    (stored,) = scan(tmp_path)
    assert stored.incarnation == incarnation and len(stored.segments) == 4
    plan = plan_recovery(stored_states(stored), known_epoch=0)
    assert dict(plan.layout.all_segments) == dict(after.all_segments)
    assert plan.subscriptions == ("billing",) and plan.controller_epoch == 6


def test_choosing_an_incarnation(tmp_path: Path) -> None:
    first, second, foreign = new_incarnation(), new_incarnation(), new_incarnation()
    for incarnation, namespace in ((first, "ns-a"), (second, "ns-a"), (foreign, "ns-b")):
        stores = lay_out(tmp_path, SegmentLayout.initial(1), incarnation)
        stores[0].close()
        write_topic_identity(tmp_path, identity(incarnation, namespace))
    stored = scan(tmp_path, TOPIC)
    assert {s.incarnation for s in stored} == {first, second, foreign}
    with pytest.raises(AmbiguousStorageError) as raised:
        choose_incarnation(stored, TOPIC, namespace="ns-a")
    assert sorted(raised.value.incarnations) == sorted([first, second])
    assert first in raised.value.message and second in raised.value.message
    assert foreign not in raised.value.message, "another deployment's storage is never offered"
    assert choose_incarnation(stored, TOPIC, second, namespace="ns-a").incarnation == second
    with pytest.raises(StorageNotFoundError):
        choose_incarnation(stored, TOPIC, foreign, namespace="ns-a")
    assert choose_incarnation(stored, TOPIC, namespace="ns-b").incarnation == foreign
    with pytest.raises(StorageNotFoundError):
        choose_incarnation(stored, TopicName("acme", "prod", "other"), namespace="ns-a")


def test_storage_from_before_incarnations_is_listed_not_recovered(tmp_path: Path) -> None:
    legacy = tmp_path / "acme" / "prod" / "orders" / "0000-ffff-0" / "log"
    legacy.mkdir(parents=True)
    (legacy / "00000000000000000000.log").write_bytes(b"x" * 100)
    (tmp_path / ".metadata" / "gcs").mkdir(parents=True)  # the embedded store is no topic
    (stored,) = scan(tmp_path)
    assert stored.incarnation is None and stored.size_bytes == 100
    assert stored.removable == [legacy.parent]
    with pytest.raises(StorageNotFoundError):
        choose_incarnation([stored], TOPIC, namespace="ns-a")
