"""What the storage holds of one topic incarnation, copy by copy, and what a recovery
from storage restores from it (``actors.control.metadata_rebuild``).

Under one shared root each segment has one copy. With a disk per node (storage scope
``node``) a segment's files are on every disk that held it: one for a segment of
factor 1, up to ``factor`` for a replicated one. The copies of one segment may be a
step apart: a follower that had not heard of the seal yet, one whose cursors were
saved a moment before the leader's. So recovery plans the layout from one state per
segment merged from its copies (a seal is never undone, so the furthest along wins;
the subscriptions of all; the highest fence), and gives each segment back what the
metadata store said of its copies before it was lost: the disk it is served from
(``storage.placements``) and, for a replicated one, its replica set
(``storage.replica_sets``): every disk holding a copy, the most advanced first, at the
newest epoch any copy saw. The controller's first replica round then elects among
them at a newer epoch, as after a restart of all of Ray, so every copy is fenced and
the new leader holds every committed entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from runtime.layout import SegmentState
from runtime.recovery import StoredSegmentState
from runtime.replication import FIRST_EPOCH
from storage.durability import Durability
from storage.replica_sets import ReplicaSet
from storage.replica_state import ReplicaState, ReplicaStateFile
from storage.topic_storage import StoredIncarnation, segment_states


@dataclass(frozen=True)
class StoredCopy:
    """One copy of a segment: the disk it is on (``None``: the shared root), what it
    says about the segment, and its ``replica.json`` if it is a replica."""

    disk: str | None
    state: StoredSegmentState
    replica: ReplicaState | None = None

    @property
    def segment_id(self) -> int:
        return self.state.info.segment_id


@dataclass
class StoredTopic:
    """A topic name's stored incarnations (each once, however many disks hold it) and
    the segment copies of each, by incarnation id."""

    incarnations: list[StoredIncarnation]
    copies: dict[str, list[StoredCopy]] = field(default_factory=dict)


def copies_of(stored: StoredIncarnation, disk: str | None) -> list[StoredCopy]:
    """The segment copies of ``stored``, one incarnation's directory on ``disk``.
    Reads each segment's files: run where they are."""
    copies = []
    for segment, state in segment_states(stored):
        replica_file = ReplicaStateFile(segment.directory, Durability())
        replica = replica_file.load() if replica_file.exists() else None
        copies.append(StoredCopy(disk, state, replica))
    return copies


def merged_states(copies: Iterable[StoredCopy]) -> list[StoredSegmentState]:
    """One state per segment, by segment id, whatever the copies' order."""
    by_segment: dict[int, list[StoredCopy]] = {}
    for copy in copies:
        by_segment.setdefault(copy.segment_id, []).append(copy)
    return [_merged(by_segment[i]) for i in sorted(by_segment)]


def _merged(copies: Sequence[StoredCopy]) -> StoredSegmentState:
    furthest = max(
        (copy.state.info for copy in copies),
        key=lambda info: (info.state is SegmentState.SEALED, info.sealed_at_epoch,
                          info.child_ids),
    )  # fmt: skip
    subscriptions = sorted({name for copy in copies for name in copy.state.subscriptions})
    fence = max(copy.state.fence_epoch for copy in copies)
    return StoredSegmentState(furthest, tuple(subscriptions), fence)


def placements(copies: Iterable[StoredCopy], sets: Mapping[int, ReplicaSet]) -> dict[int, str]:
    """Each segment's disk, as ``storage.placements`` records it: a replicated segment's
    is its leader's in ``sets`` (``replica_sets`` of the same copies)."""
    found: dict[int, str] = {}
    for copy in sorted(_on_disks(copies), key=lambda c: c.disk or ""):
        found.setdefault(copy.segment_id, copy.disk or "")
    return found | {segment_id: replicas.leader for segment_id, replicas in sets.items()}


def replica_sets(copies: Iterable[StoredCopy]) -> dict[int, ReplicaSet]:
    """The replica set of each segment that has a copy laid out as a replica: the disks
    of all its copies, the one with the newest epoch and the longest committed log
    first, at the newest epoch any copy saw (at least 1)."""
    by_segment: dict[int, list[StoredCopy]] = {}
    for copy in _on_disks(copies):
        by_segment.setdefault(copy.segment_id, []).append(copy)
    sets = {}
    for segment_id, held in sorted(by_segment.items()):
        replicas = [copy for copy in held if copy.replica is not None]
        if not replicas:
            continue
        ordered = sorted(held, key=_advance, reverse=True)
        epoch = max(copy.replica.seen_epoch for copy in replicas if copy.replica)
        disks = tuple(_unique(c.disk for c in ordered))
        sets[segment_id] = ReplicaSet(max(epoch, FIRST_EPOCH), disks)
    return sets


def _on_disks(copies: Iterable[StoredCopy]) -> list[StoredCopy]:
    return [copy for copy in copies if copy.disk is not None]


def _advance(copy: StoredCopy) -> tuple[int, int, str]:
    replica = copy.replica or ReplicaState()
    return replica.history.last_epoch, replica.high_watermark, copy.disk or ""


def _unique(disks: Iterable[str | None]) -> list[str]:
    seen: list[str] = []
    for disk in disks:
        if disk is not None and disk not in seen:
            seen.append(disk)
    return seen
