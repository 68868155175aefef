"""What stats, the web console and metrics show of a replicated segment's replicas: the
view a maintenance round (``actors.control.replica_keeper``) builds from the replicas'
answers, and the gauges counted from it. Pure, so each case is a unit test."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storage.replica_sets import ReplicaSet


def replication_gauges(views: Mapping[int, list[dict[str, Any]]]) -> tuple[int, dict[str, int]]:
    """``under_replicated_segments`` (segments with a replica not in its role, or behind
    what its leader had committed) and ``replica_lag_entries`` (by segment id: its
    furthest-behind follower's missing entries), from each segment's ``replica_view``."""
    under, lag = 0, {}
    for segment_id, view in views.items():
        under += not all(replica["inSync"] for replica in view)
        lags = [r["lag"] for r in view if r["role"] != "leader" and r["lag"] is not None]
        lag[str(segment_id)] = max(lags, default=0)
    return under, lag


def replica_view(
    record: ReplicaSet,
    statuses: Mapping[str, dict[str, Any] | None],
    nodes: Mapping[str, str],
    committed_before: int | None,
) -> list[dict[str, Any]]:
    """Each replica's node, role, epoch and lag behind its leader's log, for stats. A
    replica is *in sync* when it has the role and epoch its record says and, for a
    follower, holds what its leader had committed a round before (``committed_before``;
    its current high watermark when there was no round before): under a steady load a
    follower is always a little behind the newest entries, never behind for long."""
    leader = statuses.get(record.leader)
    leader_end = leader["endOffset"] if leader else None
    wanted_end = committed_before if committed_before is not None else (
        leader["highWatermark"] if leader else None
    )  # fmt: skip
    view = []
    for replica in record.replicas:
        status = statuses.get(replica) or {}
        wanted = "leader" if replica == record.leader else "follower"
        end = status.get("endOffset")
        role = status.get("role", "unreachable")
        in_role = role == wanted and status.get("epoch") == record.epoch
        caught_up = wanted == "leader" or (
            end is not None and wanted_end is not None and end >= wanted_end
        )
        view.append({
            "replica": replica,
            "node": nodes.get(replica),
            "role": role,
            "epoch": status.get("epoch"),
            "endOffset": end,
            "highWatermark": status.get("highWatermark"),
            "lag": None if end is None or leader_end is None else max(leader_end - end, 0),
            "filesLost": status.get("filesLost"),
            "inSync": in_role and caught_up and not status.get("filesLost"),
        })  # fmt: skip
    return view
