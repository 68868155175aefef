"""What the cluster has free for a topic's segments, read from Ray.

``runtime.capacity`` decides whether new segments fit; this module is its one
window on Ray: for each live node on which the topic's placement
(``runtime.placement``) lets its segments run, the free ``memory`` resource, the
CPUs it declares and the segments it serves (the segment directory, for hosts alive
in Ray's actor table). A segment host declares one segment's memory to Ray's
scheduler when it starts; every further segment it serves is taken off the node's
free memory here, so admission counts each segment's footprint as before. Ray's view
lags what was started a moment ago by up to a resource report, so two operations
racing for the last room may both pass here; Ray's scheduler, which accounts each
host's declared memory, is then the backstop for new hosts (a host waits for room
instead of overcommitting the node).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ray._private import state as ray_state

from actors.segment.directory import SegmentDirectory
from runtime.capacity import NodeRoom, SegmentFootprint, admit
from runtime.names import TopicName
from runtime.placement import actor_resources, placement_from_env

_MEMORY = "memory"
_CPU = "CPU"
_HOST_CLASS = "SegmentHost"
_ON_A_NODE = ("ALIVE", "RESTARTING")  # RESTARTING keeps its node's claim
_STARTING = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")  # no node chosen yet


def node_rooms(topic: TopicName) -> tuple[list[NodeRoom], int]:
    """Each live node that may hold ``topic``'s segments, and how many segment actors
    are being started with no node chosen yet."""
    wanted = actor_resources(topic, placement_from_env()) or {}
    totals = ray_state.total_resources_per_node()
    hosts, starting = _hosts()
    on_node = SegmentDirectory().per_node(set(hosts))
    footprint = SegmentFootprint.from_env().memory_bytes
    hosts_on = Counter(hosts.values())
    rooms = [
        NodeRoom(
            free_memory=float(available.get(_MEMORY, 0.0))
            - footprint * max(0, on_node[node] - hosts_on[node]),
            cpus=float(totals.get(node, {}).get(_CPU, 0.0)),
            segments=on_node[node],
        )
        for node, available in ray_state.available_resources_per_node().items()
        if _may_hold(totals.get(node, {}), wanted)
    ]
    return rooms, starting


def free_memory_per_node(topic: TopicName) -> list[float]:
    """Free memory (bytes) on each live node that may hold ``topic``'s segments."""
    return [room.free_memory for room in node_rooms(topic)[0]]


def check_capacity(what: str, topic: TopicName, new_segments: int) -> None:
    """Refuse ``what`` (``InsufficientCapacityError``) when ``new_segments`` more
    segment actors of ``topic`` do not fit; free when nothing new starts."""
    if new_segments > 0:
        rooms, starting = node_rooms(topic)
        admit(what, new_segments, SegmentFootprint.from_env(), rooms, starting)


def segment_memory() -> int:
    """The memory each segment actor declares to Ray's scheduler."""
    return SegmentFootprint.from_env().memory_bytes


def _hosts() -> tuple[dict[str, str], int]:
    """Segment hosts by name with their node id (alive or restarting there), and how
    many are being started with no node chosen yet."""
    on_node: dict[str, str] = {}
    starting = 0
    for state in (*_ON_A_NODE, *_STARTING):
        for actor in ray_state.actors(actor_state_name=state).values():
            if actor["ActorClassName"] != _HOST_CLASS:
                continue
            if state in _STARTING:
                starting += 1
            else:
                on_node[actor["Name"]] = actor["Address"]["NodeID"]
    return on_node, starting


def _may_hold(total: Mapping[str, float], wanted: Mapping[str, float]) -> bool:
    return all(total.get(resource, 0.0) >= amount for resource, amount in wanted.items())
