"""What the controller shows of a replicated segment's replicas (stats and metrics),
from their answers, without Ray: ``actors.control.replica_views``. Keeping the replicas
on a real cluster is ``tests/test_replicated_topic.py``."""

from __future__ import annotations

from typing import Any

from actors.control.replica_views import replica_view, replication_gauges
from storage.replica_sets import ReplicaSet

RECORD = ReplicaSet(2, ("d1", "d2", "d3"))
NODES = {"d1": "n1", "d2": "n2", "d3": "n3"}


def leader(end: int, hw: int, epoch: int = 2) -> dict[str, Any]:
    return {"role": "leader", "epoch": epoch, "endOffset": end, "highWatermark": hw}


def follower(end: int, epoch: int = 2) -> dict[str, Any]:
    return {"role": "follower", "epoch": epoch, "endOffset": end, "highWatermark": end}


def in_sync(view: list[dict[str, Any]]) -> list[bool]:
    return [replica["inSync"] for replica in view]


def test_a_follower_is_in_sync_once_it_holds_what_was_committed_a_round_before() -> None:
    statuses = {"d1": leader(100, 90), "d2": follower(95), "d3": follower(80)}
    view = replica_view(RECORD, statuses, NODES, committed_before=None)  # first round: hw 90
    assert in_sync(view) == [True, True, False]
    assert [r["lag"] for r in view] == [0, 5, 20]
    assert [r["node"] for r in view] == ["n1", "n2", "n3"]
    # under a steady load: behind the newest, yet holding what was committed before
    view = replica_view(RECORD, statuses, NODES, committed_before=80)
    assert in_sync(view) == [True, True, True]


def test_a_replica_out_of_its_role_or_epoch_or_silent_is_not_in_sync() -> None:
    statuses = {
        "d1": leader(100, 100),
        "d2": {"role": "none", "epoch": 0, "endOffset": 100, "highWatermark": 0},  # restarted
        "d3": follower(100, epoch=1),  # missed the election
    }
    assert in_sync(replica_view(RECORD, statuses, NODES, 100)) == [True, False, False]
    statuses = {"d1": leader(100, 100, epoch=1), "d2": follower(100), "d3": None}
    view = replica_view(RECORD, statuses, {"d1": "n1", "d2": "n2"}, 100)
    assert in_sync(view) == [False, True, False]  # a leader of an older epoch: stale
    assert view[2] | {"lag": None} == {
        "replica": "d3", "node": None, "role": "unreachable", "epoch": None,
        "endOffset": None, "highWatermark": None, "lag": None, "filesLost": None,
        "inSync": False,
    }  # fmt: skip


def test_gauges_count_segments_not_fully_in_sync_and_their_furthest_follower() -> None:
    full = replica_view(RECORD, {
        "d1": leader(10, 10), "d2": follower(10), "d3": follower(10)}, NODES, 10)  # fmt: skip
    lagging = replica_view(RECORD, {
        "d1": leader(50, 40), "d2": follower(45), "d3": follower(7)}, NODES, 40)  # fmt: skip
    lost = replica_view(RECORD, {
        "d1": leader(50, 50), "d2": follower(50), "d3": None}, NODES, 50)  # fmt: skip
    assert replication_gauges({0: full, 3: lagging, 4: lost}) == (2, {"0": 0, "3": 43, "4": 0})
    assert replication_gauges({}) == (0, {})


def test_a_replica_whose_files_are_gone_is_not_in_sync_and_says_why() -> None:
    gone = follower(100) | {"filesLost": "its directory /d2/seg is gone"}
    statuses = {"d1": leader(100, 100), "d2": gone, "d3": follower(100)}
    view = replica_view(RECORD, statuses, NODES, 100)
    assert in_sync(view) == [True, False, True]
    assert view[1]["filesLost"] == "its directory /d2/seg is gone"
    assert replication_gauges({7: view}) == (1, {"7": 0})
