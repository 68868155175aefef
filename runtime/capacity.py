"""Admission by capacity: a layout change starts segment actors only if they fit.

Every segment is a process: ~85 MB on a small machine, ~1.5 s of CPU to start, and
a steady share of a core while it runs. So the number of segments a cluster can
hold is set by its memory *and* its cores, not by any per-topic limit: a single
request for a few thousand segments would start a few thousand processes and take
the machine down with everything on it, and memory alone lets a small machine fill
with more processes than its cores can run. Each segment actor declares its memory
to Ray's scheduler, and each node holds at most ``segments_per_cpu`` segments per
CPU it declares to Ray; before the controller starts new ones it compares what
they need with what the nodes that may hold them have free, and refuses up front
what does not fit. Nothing is half-created: the check comes before any write.
Ray's raylet paces the process starts themselves (at most one per CPU at a time).

Pure: the caller reads each node's room from Ray (``actors.capacity``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.errors import InsufficientCapacityError, InvalidArgumentError

MEMORY_ENV = "RAYTOPICS_SEGMENT_MEMORY_MB"
DEFAULT_MEMORY_MB = 96  # a segment actor's resident size here, with room for its buffers
PER_CPU_ENV = "RAYTOPICS_SEGMENTS_PER_CPU"
# What a core carries while segments idle and a burst of them starts (bench/README.md,
# capacity.py): 16 per CPU keeps a full 2-core node's load within twice its cores.
DEFAULT_SEGMENTS_PER_CPU = 16
_MIB = 1 << 20


@dataclass(frozen=True)
class NodeRoom:
    """One node that may hold the topic's segments, as Ray's books show it."""

    free_memory: float  # bytes of Ray's ``memory`` resource not yet claimed
    cpus: float  # the CPUs the node declares to Ray
    segments: int  # segment actors alive or restarting on it

    def slots(self, per_cpu: int) -> int:
        """Segments the node may hold: a node that declares no CPUs (a head kept free of
        tasks) still runs processes, and counts as one CPU."""
        return int(max(self.cpus, 1.0) * per_cpu)


@dataclass(frozen=True)
class SegmentFootprint:
    """What one segment costs: the memory it declares to Ray's scheduler, and the share
    of a CPU (``1 / segments_per_cpu``) that admission counts for it."""

    memory_bytes: int
    segments_per_cpu: int = DEFAULT_SEGMENTS_PER_CPU

    @classmethod
    def from_env(cls) -> SegmentFootprint:
        megabytes = _positive_int(MEMORY_ENV, DEFAULT_MEMORY_MB)
        return cls(megabytes * _MIB, _positive_int(PER_CPU_ENV, DEFAULT_SEGMENTS_PER_CPU))

    def fitting_on(self, node: NodeRoom) -> int:
        by_memory = max(0, int(node.free_memory // self.memory_bytes))
        by_cpu = max(0, node.slots(self.segments_per_cpu) - node.segments)
        return min(by_memory, by_cpu)

    def fitting(self, nodes: Sequence[NodeRoom], starting: int = 0) -> int:
        """How many more segments fit on ``nodes``, ``starting`` more being on their way
        to a node not yet chosen: an actor lives on one node, so what is left over on
        each node does not add up."""
        return max(0, sum(self.fitting_on(node) for node in nodes) - starting)


def admit(
    what: str,
    new_segments: int,
    footprint: SegmentFootprint,
    nodes: Sequence[NodeRoom],
    starting: int = 0,
) -> None:
    """Refuse ``what`` (e.g. "creating topic://a/b/c") when its ``new_segments`` segment
    actors do not fit on the nodes that may hold them, naming what was asked, what one
    segment needs and what is free by memory and by CPU."""
    fitting = footprint.fitting(nodes, starting)
    if new_segments <= fitting:
        return
    per_cpu = footprint.segments_per_cpu
    free = sum(max(0.0, node.free_memory) for node in nodes)
    running = sum(node.segments for node in nodes) + starting
    slots = sum(node.slots(per_cpu) for node in nodes)
    one = len(nodes) == 1
    have = "has" if one else "have"
    raise InsufficientCapacityError(
        f"{what} needs {new_segments} new segment actors of {_size(footprint.memory_bytes)} "
        f"each ({_size(new_segments * footprint.memory_bytes)}), but the {len(nodes)} "
        f"node{'' if one else 's'} that may hold them {have} {_size(free)} free and "
        f"run{'s' if one else ''} {running} of the {slots} segments their CPUs carry "
        f"({per_cpu} per CPU): {fitting} more fit. Add nodes, delete or merge segments, "
        f"or change {MEMORY_ENV} or {PER_CPU_ENV} if segments really need less"
    )


def _positive_int(env: str, default: int) -> int:
    raw = os.environ.get(env)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgumentError(f"{env} must be an integer, got {raw!r}") from None
    if value < 1:
        raise InvalidArgumentError(f"{env} must be >= 1, got {value}")
    return value


def _size(num_bytes: float) -> str:
    if num_bytes >= 1 << 30:
        return f"{num_bytes / (1 << 30):.1f} GiB"
    return f"{num_bytes / _MIB:.0f} MiB"
