"""Where a new segment is laid out when every node keeps its own disk
(``actors.control.node_disks.NodeDisks.place``), without Ray: the live nodes and the
controller's own node are stand-ins."""

from __future__ import annotations

import asyncio

import pytest

from actors.control import node_disks
from actors.control.node_disks import NodeDisks
from runtime.layout import HashRange, SegmentInfo
from runtime.names import MAX_HASH, TopicName
from storage.metadata import MemoryKeyValue, MetadataStore
from storage.placements import SegmentPlacements

TOPIC = TopicName.parse("topic://t/ns/orders")
NODES = {"d0": "n0", "d1": "n1", "d2": "n2"}  # disk -> node; the controller runs on n0


@pytest.fixture
def disks(monkeypatch: pytest.MonkeyPatch) -> NodeDisks:
    monkeypatch.setattr(node_disks, "_own_node", lambda: "n0")
    found = object.__new__(NodeDisks)
    found.topic, found._nodes, found._placing = TOPIC, dict(NODES), asyncio.Lock()
    found.live = lambda: dict(NODES)
    return found


def place(disks: NodeDisks, segment_id: int, leader: bool) -> str:
    placements = SegmentPlacements(MetadataStore(kv=MemoryKeyValue()), TOPIC, "i")
    for other, disk in ((8, "d1"), (9, "d2")):  # d0 holds the fewest segments
        placements.place(other, disk)
    info = SegmentInfo.active(segment_id, HashRange(start=0, end=MAX_HASH), 0)
    node = asyncio.run(disks.place(info.name(TOPIC), info, placements, set, leader=leader))
    assert node == NODES[placements.get(segment_id)]
    return placements.get(segment_id)


def test_a_replicated_leader_goes_off_the_controllers_node(disks: NodeDisks) -> None:
    assert disks.own_disks() == {"d0"}
    assert place(disks, 1, leader=True) in {"d1", "d2"}


def test_a_segment_of_one_copy_goes_to_the_least_loaded_disk_wherever_it_is(
    disks: NodeDisks,
) -> None:
    assert place(disks, 1, leader=False) == "d0"


def test_the_controllers_node_is_used_when_it_is_the_only_one(disks: NodeDisks) -> None:
    disks._nodes = {"d0": "n0"}
    disks.live = lambda: {"d0": "n0"}
    placements = SegmentPlacements(MetadataStore(kv=MemoryKeyValue()), TOPIC, "i")
    info = SegmentInfo.active(1, HashRange(start=0, end=MAX_HASH), 0)
    asyncio.run(disks.place(info.name(TOPIC), info, placements, set, leader=True))
    assert placements.get(1) == "d0"
