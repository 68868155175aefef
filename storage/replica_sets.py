"""Who holds each replicated segment: its replicas' node disks, the leader's first, and
its leader epoch, in the metadata store (``runtime.replication`` says what an epoch is).

This record is the one authority of replication. A replica's own ``replica.json``
says what it saw; which replica leads, and since which epoch, is only what this record
says, and the topic's controller changes it only by compare-and-swap: of two
controllers (a fenced one and its successor) electing at once, one wins and the other
learns it lost (``BadVersion``), and a replica is told to lead only after the record
that makes it the leader was written. Replicas are named by their disk ids
(``storage.placements``), not by Ray node ids: a restarted Ray has new node ids, and
the disks are what hold the copies.

The record is written whole and read whole; one per segment of a topic incarnation,
under the topic, so it goes with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.errors import UnavailableError
from runtime.names import TopicName
from runtime.replication import FIRST_EPOCH
from storage.metadata import MetadataStore, Version
from storage.metadata_paths import replica_sets_path
from storage.segment_entries import SegmentEntries


@dataclass(frozen=True)
class ReplicaSet:
    """A segment's replicas (disk ids, the leader first) and its leader epoch."""

    epoch: int
    replicas: tuple[str, ...]

    def __post_init__(self) -> None:
        distinct = len(set(self.replicas)) == len(self.replicas)
        if self.epoch < FIRST_EPOCH or not self.replicas or not distinct:
            raise ValueError(
                f"a replica set needs epoch >= {FIRST_EPOCH}, distinct replicas: {self}"
            )

    @property
    def leader(self) -> str:
        return self.replicas[0]

    @property
    def followers(self) -> tuple[str, ...]:
        return self.replicas[1:]

    def elected(self, leader: str) -> ReplicaSet:
        """The next epoch, led by ``leader`` (one of the replicas)."""
        if leader not in self.replicas:
            raise ValueError(f"{leader} is not a replica of {self.replicas}")
        others = tuple(replica for replica in self.replicas if replica != leader)
        return ReplicaSet(self.epoch + 1, (leader, *others))

    def replaced(self, gone: str, new: str) -> ReplicaSet:
        """Follower ``gone`` replaced by ``new`` (a disk of another node), same epoch: the
        leader keeps leading, and counts ``new`` once it caught up."""
        if gone == self.leader or gone not in self.replicas or new in self.replicas:
            raise ValueError(f"cannot replace follower {gone} of {self.replicas} by {new}")
        return ReplicaSet(self.epoch, tuple(new if r == gone else r for r in self.replicas))

    def resized(self, factor: int, new: tuple[str, ...] = ()) -> ReplicaSet:
        """``factor`` replicas, same epoch: the followers ``new`` (disks of other nodes)
        added, or the last followers dropped; the leader stays."""
        grown = len(self.replicas) + len(new)
        fits = factor == grown if new else 1 <= factor <= grown
        if not fits or set(new) & set(self.replicas):
            raise ValueError(f"cannot make {self.replicas} {factor} replicas with {new}")
        return ReplicaSet(self.epoch, (*self.replicas, *new)[:factor])

    def to_bytes(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "replicas": list(self.replicas)}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ReplicaSet:
        try:
            data: Any = json.loads(raw)
            replicas = data["replicas"]
            if not isinstance(replicas, list) or not all(isinstance(r, str) for r in replicas):
                raise ValueError(f"replicas {replicas!r} are not disk ids")
            epoch = data["epoch"]
            if isinstance(epoch, bool) or not isinstance(epoch, int):
                raise ValueError(f"epoch {epoch!r} is not an integer")
            return cls(epoch, tuple(replicas))
        except (ValueError, KeyError, TypeError) as err:
            raise UnavailableError(
                f"the replica set at {where} cannot be read ({err}): no replica may lead "
                "until an operator repairs it"
            ) from None


class ReplicaSets(SegmentEntries):
    """The replica sets of one topic incarnation's segments (segment id → ``ReplicaSet``).

    Who calls: the topic's controller only (creating a replicated segment, electing,
    replacing a follower). What it affects: which replica producers and readers reach,
    and which replicas an election asks."""

    def __init__(self, store: MetadataStore, topic: TopicName, incarnation: str) -> None:
        super().__init__(store, replica_sets_path(topic, incarnation))

    def get(self, segment_id: int) -> tuple[ReplicaSet, Version] | None:
        """The segment's replica set and the version a change must expect; ``None`` for
        a segment that is not replicated."""
        found = self.store.get(self._path(segment_id))
        if found is None:
            return None
        return ReplicaSet.from_bytes(found.value, self._path(segment_id)), found.version

    def all(self) -> dict[int, ReplicaSet]:
        """Every replicated segment's replica set, read together (``MetadataStore.get_all``:
        a round reads them all each second)."""
        base = f"{self._base}/"
        return {
            int(path[len(base) :]): ReplicaSet.from_bytes(found.value, path)
            for path, found in self.store.get_all(base).items()
        }

    def create(self, segment_id: int, replicas: ReplicaSet) -> ReplicaSet:
        """Record a new segment's replica set unless it has one; returns the one it has
        (a resumed operation places a segment's replicas where its first attempt did)."""
        return ReplicaSet.from_bytes(
            self._write_first(segment_id, replicas.to_bytes()), self._path(segment_id)
        )

    def change(self, segment_id: int, expected: Version, replicas: ReplicaSet) -> Version:
        """Replace the segment's replica set if it is still at ``expected``; ``BadVersion``
        when another change came first (read it again: an election may have been won
        elsewhere)."""
        return self.store.compare_and_swap(self._path(segment_id), expected, replicas.to_bytes())
