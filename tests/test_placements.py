"""Where a segment's files are when every node keeps its own disk: each storage root's
disk id, the per-segment record of it, and the choice of a new segment's disk."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import InvalidArgumentError
from runtime.names import TopicName
from runtime.placement import choose_disk
from storage.durability import (
    NODE_STORAGE_ROOT_ENV,
    STORAGE_SCOPE_ENV,
    node_storage_root,
    storage_scope,
)
from storage.metadata import MetadataStore
from storage.placements import DISK_FILE, SegmentPlacements, disk_id

TOPIC = TopicName.parse("topic://t/ns/placed")
INCARNATION = "20261126T000000Z-0a0b0c0d"


def test_a_disk_id_is_made_once_and_agreed_on_by_racing_processes(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: disk_id(root), range(32)))
    assert len(ids) == 1 and disk_id(root) in ids
    assert [p.name for p in root.iterdir()] == [DISK_FILE]  # no temporary left
    assert disk_id(tmp_path / "other") not in ids


def test_the_node_root_is_the_nodes_own_else_the_clusters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(NODE_STORAGE_ROOT_ENV, raising=False)
    assert node_storage_root(tmp_path / "cluster") == tmp_path / "cluster"
    monkeypatch.setenv(NODE_STORAGE_ROOT_ENV, str(tmp_path / "mine"))
    assert node_storage_root(tmp_path / "cluster") == tmp_path / "mine"


def test_the_storage_scope_is_shared_unless_set_and_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(STORAGE_SCOPE_ENV, raising=False)
    assert storage_scope() == "shared"
    monkeypatch.setenv(STORAGE_SCOPE_ENV, "node")
    assert storage_scope() == "node"
    monkeypatch.setenv(STORAGE_SCOPE_ENV, "nfs")
    with pytest.raises(InvalidArgumentError, match="shared.*node"):
        storage_scope()


def test_children_go_to_a_disk_without_their_parents_then_the_least_loaded() -> None:
    assert choose_disk({"a": 3, "b": 0}) == "b"
    assert choose_disk({"a": 0, "b": 5}, avoid={"a"}) == "b"  # off the hot node
    assert choose_disk({"a": 1, "b": 1}) == "a"  # repeatable: the first of a tie
    assert choose_disk({"a": 2}, avoid={"a"}) == "a"  # the only node there is
    with pytest.raises(InvalidArgumentError):
        choose_disk({})


@given(
    st.dictionaries(st.text(min_size=1, max_size=4), st.integers(0, 50), min_size=1),
    st.sets(st.text(min_size=1, max_size=4)),
)
def test_the_chosen_disk_is_live_and_no_other_allowed_one_is_less_loaded(
    load: dict[str, int], avoid: set[str]
) -> None:
    chosen = choose_disk(load, avoid)
    allowed = [d for d in load if d not in avoid] or list(load)
    assert chosen in allowed
    assert load[chosen] == min(load[d] for d in allowed)


def test_a_segment_keeps_the_disk_it_was_first_placed_on(ray_cluster, unique: str) -> None:
    placements = SegmentPlacements(MetadataStore(f"test-placed-{unique}"), TOPIC, INCARNATION)
    assert placements.get(3) is None
    assert placements.place(3, "disk-a") == "disk-a"
    assert placements.place(3, "disk-b") == "disk-a"  # a resumed operation: the same disk
    placements.place(4, "disk-b")
    assert placements.all() == {3: "disk-a", 4: "disk-b"}
    placements.delete(3)
    placements.delete(3)  # idempotent
    assert placements.all() == {4: "disk-b"}
    placements.delete_all()
    assert placements.all() == {}
